"""The docs index links every page of docs/ (and each link it has leads to a file); the user docs (README,
CHANGELOG, docs/, and the experiments' pages and study.toml files, whose text docs/results.md renders) speak
without the project's issue tracker, which their readers cannot see."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: A reference to a tracker issue: "issue 30", "Issues 8", "issue #4", "issue-10", "the issue's target",
#: "issue's target".
TRACKER_REFERENCE = re.compile(
    r"\b(?:the\s+)?issue-\d+|\bissues?\s+#?\d+\b|\bthe\s+issue(?:['\u2019]?s)?\b|\bissue['\u2019]s\b",
    re.IGNORECASE,
)
#: A URL may name an issue (github.com/OWNER/REPO/issues/N), and so may the text of a link to one.
ISSUE_LINK = re.compile(r"\[[^\]]*\]\(https?://github\.com/[^)\s]*/issues/[^)\s]*\)")
URL = re.compile(r"https?://[^\s)>\]]+")
#: Generated blocks (page's path from the repository root, block name) not checked (none now: every study
#: says its targets without the tracker).
UNCHECKED_BLOCKS: set[tuple[str, str]] = set()


def _blank(match: re.Match[str]) -> str:
    """The match replaced by its newlines only, so that line numbers after it stay right."""
    return "\n" * match.group(0).count("\n")


def tracker_references(text: str, unchecked_blocks: tuple[str, ...] = ()) -> list[str]:
    """``LINE: WORDS`` for each reference to a tracker issue in markdown ``text``, outside URLs, links to
    GitHub issues and the generated blocks named in ``unchecked_blocks``."""
    for name in unchecked_blocks:
        block = re.compile(rf"<!-- {re.escape(name)}:begin -->.*?<!-- {re.escape(name)}:end -->", re.DOTALL)
        text = block.sub(_blank, text)
    text = URL.sub("", ISSUE_LINK.sub("", text))
    return [
        f"{text.count(chr(10), 0, match.start()) + 1}: {' '.join(match.group(0).split())}"
        for match in TRACKER_REFERENCE.finditer(text)
    ]


def user_doc_pages(root: Path = ROOT) -> list[Path]:
    """Every page under ``root`` that a reader outside the team sees: README.md, CHANGELOG.md, docs/*.md,
    every markdown file under experiments/ (study READMEs and rendered results tables) and each study's
    study.toml (its question, intro and target texts are rendered into docs/results.md)."""
    pages = [root / "README.md", root / "CHANGELOG.md", *sorted((root / "docs").glob("*.md")),
             *sorted((root / "experiments").rglob("*.md")), *sorted((root / "experiments").glob("*/study.toml"))]
    return [page for page in pages if page.is_file()]


def tracker_findings(root: Path = ROOT) -> list[str]:
    """``PAGE:LINE: WORDS`` for each reference to a tracker issue in the user docs under ``root``."""
    found = []
    for page in user_doc_pages(root):
        where = page.relative_to(root).as_posix()
        unchecked = tuple(block for path, block in UNCHECKED_BLOCKS if path == where)
        found += [f"{where}:{line}" for line in tracker_references(page.read_text(), unchecked)]
    return found


def test_the_docs_index_lists_every_page() -> None:
    index = (DOCS / "index.md").read_text()
    links = set(re.findall(r"\]\(([^)#]+)\)", index))
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    assert sorted(pages - links) == [], "add these pages to docs/index.md"
    assert [link for link in links if not (DOCS / link).exists()] == []


def test_tracker_references_are_found_in_a_sample() -> None:
    sample = (
        "Since issue 30 every runtime has one name.\n"
        "Issue 3: heads become experts; see Issues #12.\n"
        "It ran after the issue-10 refactor, at the\n"
        "issue's batch 32 x 128, as the issue asks.\n"
        "Reported at https://github.com/o/r/issues/7 and [issue 7](https://github.com/o/r/issues/7).\n"
        "<!-- deep_cuts:begin -->\nthe issue asks 8 of 9 runs\n<!-- deep_cuts:end -->\n"
        "An issue with tissue 4 or reissue 5 is not one; the issues are.\n"
        "| target | issue's target | reached |\n"
    )
    assert tracker_references(sample, ("deep_cuts",)) == [
        "1: issue 30",
        "2: Issue 3",
        "2: Issues #12",
        "3: the issue-10",
        "3: the issue's",
        "4: the issue",
        "9: the issues",
        "10: issue's",
    ]
    assert tracker_references(sample)[-3:] == ["7: the issue", "9: the issues", "10: issue's"]
    assert tracker_references("The target is 2x; a measured 1.95x counts as meeting it.") == []


def test_the_checked_pages_include_the_experiments() -> None:
    pages = {page.relative_to(ROOT).as_posix() for page in user_doc_pages()}
    for page in ("README.md", "CHANGELOG.md", "docs/results.md", "experiments/README.md",
                 "experiments/deep_cuts/README.md", "experiments/compress_cost/pick_README.md",
                 "experiments/graph_speed/results/graph_speed.md", "experiments/deep_cuts/study.toml"):
        assert page in pages, page


def test_tracker_references_are_found_in_planted_experiment_pages(tmp_path: Path) -> None:
    """The page check itself, on a planted tree: a study README, a results page and a study.toml that name
    tracker issues are reported; a study's code and results JSON are not user docs."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text("Deep cuts: 7 of 9 runs kept >= 99%.\n")
    study = tmp_path / "experiments" / "deep_cuts"
    (study / "results").mkdir(parents=True)
    (study / "README.md").write_text("# Deep cuts on OpenVINO int8 (issue 36)\n\nThe target (issue 39's) is 8.\n")
    (study / "results" / "runs.md").write_text("| target | issue's target |\n")
    (study / "study.toml").write_text('question = "Deep cuts (the issue asks 8 of 9 runs)"\n')
    (study / "bench.py").write_text('"""The targets of issue 36."""\n')
    (study / "results" / "runs.json").write_text('{"note": "issue 36"}\n')
    assert tracker_findings(tmp_path) == [
        "experiments/deep_cuts/README.md:1: issue 36",
        "experiments/deep_cuts/README.md:3: issue 39",
        "experiments/deep_cuts/results/runs.md:1: issue's",
        "experiments/deep_cuts/study.toml:1: the issue",
    ]


def test_user_docs_do_not_refer_to_tracker_issues() -> None:
    found = tracker_findings()
    assert found == [], "say the thing itself (the target, the change), not the issue that asked for it"
