"""``tests/ci_slow.py`` names tests that exist, and the conftest hook marks them ``slow``."""

import ast
import os
import re

from absl.testing import absltest

from tests.ci_slow import CI_SLOW_TESTS

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _test_methods(path):
    """``{class name: {test method names}}`` of one test file, read with ``ast``."""
    with open(os.path.join(_ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return {node.name: {m.name for m in node.body if isinstance(m, ast.FunctionDef)
                        and m.name.startswith("test")}
            for node in tree.body if isinstance(node, ast.ClassDef)}


class CiSlowListTest(absltest.TestCase):

    def test_every_entry_names_a_test_method_or_a_parameterized_case_of_one(self):
        self.assertEqual(len(CI_SLOW_TESTS), len(set(CI_SLOW_TESTS)), "duplicate entries")
        for entry in CI_SLOW_TESTS:
            with self.subTest(entry=entry):
                path, cls, name = entry.split("::")
                self.assertTrue(os.path.isfile(os.path.join(_ROOT, path)), path)
                methods = _test_methods(path).get(cls)
                self.assertIsNotNone(methods, f"no class {cls} in {path}")
                # A parameterized case is the method's name plus "_<case name>".
                self.assertTrue(any(name == m or re.fullmatch(re.escape(m) + r"_\w+", name)
                                    for m in methods), f"no test {name} in {path}::{cls}")

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
