"""``tests/ci_slow.py`` names tests that exist, and the conftest hook marks them ``slow``."""

import importlib
import os

from unittest import mock

from absl.testing import absltest

from tests import ci_slow
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
                path, cls, *name = entry.split("::")
                self.assertTrue(os.path.isfile(os.path.join(_ROOT, path)), path)
                test_class = _test_class(path, cls)
                self.assertIsNotNone(test_class, f"no class {cls} in {path}")
                tests = [m for m in dir(test_class)
                         if m.startswith("test") and callable(getattr(test_class, m))]
                if not name:  # a whole class
                    self.assertTrue(tests, f"no tests in {path}::{cls}")
                    continue
                self.assertLen(name, 1, entry)
                name = name[0]
                if name.endswith("*"):  # a method with all its parameterized cases
                    self.assertTrue(name.startswith("test")
                                    and any(m.startswith(name[:-1]) for m in tests),
                                    f"no test starting with {name[:-1]} in {path}::{cls}")
                    continue
                # absl's parameterized cases are methods of the class under their full names
                # (the method's name plus "_<case name>"), as pytest collects them: a
                # misspelled or renamed case is caught, not only a missing method.
                self.assertIn(name, tests, f"no test {name} in {path}::{cls}")

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

    def test_class_and_prefix_entries_match_only_their_tests(self):
        with mock.patch.object(ci_slow, "_EXACT", frozenset({"a.py::A::test_x"})), \
                mock.patch.object(ci_slow, "_CLASSES", frozenset({"a.py::B"})), \
                mock.patch.object(ci_slow, "_PREFIXES", ("a.py::C::test_p",)):
            for nodeid, slow in [("a.py::A::test_x", True), ("a.py::A::test_x1", False),
                                 ("a.py::B::test_any", True), ("a.py::Bx::test_any", False),
                                 ("a.py::C::test_p_case0", True), ("a.py::C::test_q", False),
                                 ("b.py::B::test_any", False)]:
                self.assertEqual(ci_slow.is_ci_slow(nodeid), slow, nodeid)


if __name__ == "__main__":
    absltest.main()
