"""The project's scripts, grouped by purpose (scripts/README.md is the index). Entry scripts are run, never
imported; what two of them share lives in ``scripts.lib``, which they import as a package
(tests/test_layering.py holds it: no ``sys.path`` edits, no script importing another)."""
