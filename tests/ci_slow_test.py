"""``tests/ci_slow.py`` names tests that exist, and the conftest hook marks them ``slow``."""

import importlib
import os

from absl.testing import absltest

from tests.ci_slow import CI_SLOW_TESTS

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _test_class(path, cls):
    """The class ``cls`` of the test module at ``path`` (imported as pytest imports it, so in
    a pytest run it is already loaded), or ``None``."""
    module = importlib.import_module(path[:-len(".py")].replace("/", "."))
    return getattr(module, cls, None)


class CiSlowListTest(absltest.TestCase):

    def test_every_entry_names_a_test_method_or_a_parameterized_case_of_one(self):
        self.assertEqual(len(CI_SLOW_TESTS), len(set(CI_SLOW_TESTS)), "duplicate entries")
        for entry in CI_SLOW_TESTS:
            with self.subTest(entry=entry):
                path, cls, name = entry.split("::")
                self.assertTrue(os.path.isfile(os.path.join(_ROOT, path)), path)
                test_class = _test_class(path, cls)
                self.assertIsNotNone(test_class, f"no class {cls} in {path}")
                # absl's parameterized cases are methods of the class under their full names
                # (the method's name plus "_<case name>"), as pytest collects them: a
                # misspelled or renamed case is caught, not only a missing method.
                method = getattr(test_class, name, None)
                self.assertTrue(name.startswith("test") and callable(method),
                                f"no test {name} in {path}::{cls}")

    def test_the_hook_marks_the_listed_tests_slow(self):
        # The marks are visible on this run's items only through pytest; here the hook itself
        # is called on stand-in items.
        from tests import conftest  # pylint: disable=import-outside-toplevel

        class Item:
            def __init__(self, nodeid):
                self.nodeid, self.marks = nodeid, []

            def add_marker(self, mark):
                self.marks.append(mark.name)

        listed, other = Item(CI_SLOW_TESTS[0]), Item("tests/ci_slow_test.py::X::test_y")
        conftest.pytest_collection_modifyitems(None, [listed, other])
        self.assertEqual(listed.marks, ["slow"])
        self.assertEqual(other.marks, [])


if __name__ == "__main__":
    absltest.main()
