"""README.md's environment-variable table lists every variable the code reads or sets."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("dsl", "schedules", "targets")
# os.environ.get("X") / os.environ["X"] / .setdefault("X" / .pop("X" / os.getenv("X")
USE = re.compile(r"(?:environ(?:\.(?:get|setdefault|pop))?\s*[(\[]|getenv\()"
                 r"""\s*["']([A-Z][A-Z0-9_]+)["']""")
# a module constant naming a variable, read as os.environ.get(ENV)
CONST = re.compile(r"""^\s*[A-Z_]*ENV[A-Z_]*\s*=\s*["']([A-Z][A-Z0-9_]+)["']""", re.M)


def variables_in_code() -> set[str]:
    found = set()
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            found |= set(USE.findall(text)) | set(CONST.findall(text))
    return found


def variables_in_readme() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    first_cells = re.findall(r"^\| ([^|]+) \|", section, re.M)
    return {v for c in first_cells for v in re.findall(r"`([A-Z][A-Z0-9_]+)`", c)}


def test_the_grep_finds_what_it_should():
    found = variables_in_code()
    assert {"DSL_KERNEL_CACHE_MAX", "DSL_TUNE_DEBUG", "DSL_CACHE_DIR", "DSL_TUNING_DB",
            "TVM_NUM_THREADS"} <= found


def test_readme_table_lists_every_variable_the_code_reads():
    missing = variables_in_code() - variables_in_readme()
    assert not missing, f"add to README.md's 'Environment variables' table: {sorted(missing)}"
