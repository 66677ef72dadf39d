"""The documentation says what the code and the published tables say.

- the minimal pretrained-model config in README.md (and the fuller one in docs/pretrained.md),
  copied under a new experiment name into the shipped config, passes the config check the
  workflow runs (headcount.config.load_experiments, as tests/test_config.py calls it);
- config/README.md documents every key of workflow/schemas/config.schema.yaml, and no key the
  schema lacks;
- every relative link (and #anchor) in README.md, config/README.md and docs/**/*.md resolves;
- every headline number in README.md appears in the published table its line links;
- the layout section names the folders and rule files the tree has;
- the bf16 speed-up is quoted as benchmarks/RESULTS.md measured it.

Fast: no workflow runs, only the config check.
"""

import copy
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from headcount.config import load_experiments, pretrained_files

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow/schemas/config.schema.yaml"
README = REPO / "README.md"


def shipped_config() -> dict:
    return yaml.safe_load((REPO / "config/config.yaml").read_text())


def merged(override: dict) -> dict:
    """The shipped config with `override` merged in as `snakemake --configfile` merges it."""
    from snakemake.utils import update_config

    config = copy.deepcopy(shipped_config())
    update_config(config, copy.deepcopy(override))
    return config


def fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


# --------------------------------------------------------------------------------------------
# (a) The pretrained-model configs people copy


def pretrained_examples(path: Path) -> list[dict]:
    """The YAML blocks of `path` that define a pretrained experiment."""
    blocks = [yaml.safe_load(b) for b in fenced_blocks(path.read_text(), "yaml")]
    return [b for b in blocks if isinstance(b, dict) and any(
        isinstance(e, dict) and "pretrained" in e for e in (b.get("experiments") or {}).values())]


def copied_under_a_new_name(example: dict, name: str) -> dict:
    """The example's experiment renamed to `name` and run alone, as a user copies it."""
    (experiment,) = example["experiments"].values()
    return {"run": [name], "experiments": {name: copy.deepcopy(experiment)}}


@pytest.mark.parametrize("page, count", [("README.md", 1), ("docs/pretrained.md", 3)])
@pytest.mark.slow
def test_the_pretrained_config_validates_when_copied_under_a_new_name(page, count, tmp_path, monkeypatch):
    examples = pretrained_examples(REPO / page)
    assert len(examples) == count, f"{page}: expected {count} YAML blocks with a pretrained experiment"
    monkeypatch.chdir(tmp_path)  # where the files an example names are put, as a user has them
    for example in examples:
        config = merged(copied_under_a_new_name(example, "a_copy_of_the_example"))
        for path in pretrained_files(config["experiments"]["a_copy_of_the_example"]):
            folder = not Path(path).suffix  # a data-bin directory; the rest are files
            (Path(path) if folder else Path(path).parent).mkdir(parents=True, exist_ok=True)
            if not folder:
                Path(path).touch()
        experiments = load_experiments(config, SCHEMA)  # raises ConfigError naming every problem
        copy_ = experiments["a_copy_of_the_example"]
        # it is built (so the pretrained checks ran on it), and it is a pretrained experiment
        assert config["run"] == ["a_copy_of_the_example"] and copy_["pretrained"]
        assert copy_["prune"]["lr_schedule"] == "noam"


@pytest.mark.slow
def test_the_readme_variants_validate_too():
    """'Without pruning' (empty grids) as README says to write it; the demo's config."""
    (example,) = pretrained_examples(README)
    without = copied_under_a_new_name(example, "no_pruning")
    without["experiments"]["no_pruning"]["prune"]["lambdas"] = {"enc": [], "all": []}
    assert load_experiments(merged(without), SCHEMA)["no_pruning"]["prune"]["lambdas"] == {"enc": [], "all": []}

    demo = yaml.safe_load((REPO / "config/demo.yaml").read_text())
    assert load_experiments(merged(demo), SCHEMA)["demo"]["synthetic"]
    assert "config/demo.yaml" in (REPO / "Makefile").read_text()


# --------------------------------------------------------------------------------------------
# (b) config/README.md against the schema


def schema_paths(node: dict, defs: dict, prefix=(), stop=frozenset()) -> set[str]:
    """Dotted key paths of a schema node; `<>` stands for any name (additionalProperties)."""
    out = set()
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return out if name in stop else schema_paths(defs[name], defs, prefix, stop)
    for combinator in ("oneOf", "anyOf", "allOf"):
        for sub in node.get(combinator, []):
            out |= schema_paths(sub, defs, prefix, stop)
    for key, sub in node.get("properties", {}).items():
        out.add(".".join(prefix + (key,)))
        out |= schema_paths(sub, defs, prefix + (key,), stop)
    if isinstance(node.get("additionalProperties"), dict):
        out.add(".".join(prefix + ("<>",)))
        out |= schema_paths(node["additionalProperties"], defs, prefix + ("<>",), stop)
    if isinstance(node.get("items"), dict):
        out |= schema_paths(node["items"], defs, prefix, stop)
    return out


def schema_keys() -> dict[str, set[str]]:
    schema = yaml.safe_load(SCHEMA.read_text())
    defs = schema["$defs"]
    experiment = schema_paths(defs["partial_experiment"], defs, stop=frozenset({"pair", "side"}))
    return {
        "Top level": schema_paths(schema, defs, stop=frozenset({"partial_experiment"})),
        # prune.training is any key of `training`, documented once as `prune.training`
        "An experiment": {k for k in experiment if not k.startswith("prune.training.")},
        "A corpus pair and side": schema_paths(defs["pair"], defs, stop=frozenset({"side"}))
        | schema_paths(defs["side"], defs),
    }


def documented_keys(text: str) -> dict[str, set[str]]:
    """Backticked names in `### ` headings and in the first column of the tables under each `## `
    section."""
    sections: dict[str, set[str]] = {}
    section = None
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("### ") and section:
            sections.setdefault(section, set()).update(re.findall(r"`([^`]+)`", line))
        elif line.startswith("|") and section and not re.match(r"^\|[\s|:-]+\|$", line):
            first = re.split(r"(?<!\\)\|", line)[1]
            if first.strip() == "key":
                continue
            for key in re.findall(r"`([^`]+)`", first):
                sections.setdefault(section, set()).add(re.sub(r"<[^>]*>", "<>", key))
    return sections


def test_config_readme_documents_every_schema_key_and_no_other():
    documented = documented_keys((REPO / "config/README.md").read_text())
    problems = []
    for section, keys in schema_keys().items():
        have = documented.get(section, set())
        problems += [f"'## {section}' lacks `{k}`" for k in sorted(keys - have)]
        problems += [f"'## {section}' documents `{k}`, which the schema does not have" for k in sorted(have - keys)]
    assert not problems, "config/README.md against the schema:\n  " + "\n  ".join(problems)


# --------------------------------------------------------------------------------------------
# (c) Relative links


def pages() -> list[Path]:
    return [README, REPO / "config/README.md", *sorted((REPO / "docs").rglob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M).splitlines():
        match = re.match(r"^#{1,6} (.+)$", line)
        if match:
            base = slug(match.group(1))
            n = seen.get(base, 0)
            out.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return out


def links(path: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", prose(path.read_text()))


def test_every_relative_link_resolves():
    broken = []
    for page in pages():
        for target in links(page):
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            resolved = (page.parent / file).resolve() if file else page
            where = f"{page.relative_to(REPO)}: ({target})"
            if not resolved.exists():
                broken.append(f"{where}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where}: no heading with anchor #{anchor} in {resolved.relative_to(REPO)}")
    assert not broken, "broken links:\n  " + "\n  ".join(broken)


def test_the_link_checker_sees_links_and_anchors():
    assert "docs/method.md" in links(README)
    assert "a-first-result-in-10-minutes-make-demo" in anchors(README)
    assert slug("Where the data comes from: URLs or a mirror") == "where-the-data-comes-from-urls-or-a-mirror"


# --------------------------------------------------------------------------------------------
# (d) Headline numbers against the published tables


def headline_lines() -> list[str]:
    text = README.read_text()
    block = re.search(r"<!-- headline numbers.*?-->\n(.*?)<!-- end headline numbers -->", text, flags=re.S)
    assert block, "README.md: no headline numbers block"
    return [item.replace("\n", " ") for item in re.split(r"^- ", block.group(1), flags=re.M) if item.strip()]


def number_in(number: str, table: str) -> bool:
    """`number` is in `table` as written, or a number of `table` rounds to it."""
    if re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", table):
        return True
    decimals = len(number.split(".")[1])
    return any(round(float(x), decimals) == float(number)
               for x in re.findall(r"[+-]?\d+\.\d+(?:[eE][+-]?\d+)?", table))


def test_headline_numbers_are_the_published_tables():
    lines = headline_lines()
    assert 4 <= len(lines) <= 6
    problems = []
    for line in lines:
        cited = [t for t in re.findall(r"\]\(([^)]+)\)", line) if t.startswith("docs/tables/")]
        if not cited:
            problems.append(f"cites no table in docs/tables/: {line[:60]}...")
            continue
        tables = "\n".join((REPO / t).read_text() for t in cited)
        text = re.sub(r"\]\([^)]*\)", "]", line)  # the numbers, not the file names
        for number in re.findall(r"[+-]?\d+\.\d+", text) + re.findall(r"\b\d+/\d+/\d+\b", text):
            if not number_in(number, tables):
                problems.append(f"{number} is not in {', '.join(cited)}: {line[:60]}...")
    assert not problems, "README.md headline numbers:\n  " + "\n  ".join(problems)


# --------------------------------------------------------------------------------------------
# Layout, and a number quoted in several places


def test_the_layout_section_names_the_tree():
    text = README.read_text()
    section = text.split("## Layout", 1)[1]
    (block,) = fenced_blocks(section, "")[:1]
    named = {line.split()[0].rstrip("/") for line in block.splitlines() if line[:1].strip()}
    missing = sorted(n for n in named if not (REPO / n).exists())
    assert not missing, f"README's layout names what the tree lacks: {missing}"
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True,
                             check=True).stdout.split()
    folders = {p.split("/")[0] for p in tracked if "/" in p and not p.startswith(".")}
    top = {n.split("/")[0] for n in named}
    assert not folders - top, f"README's layout leaves out {sorted(folders - top)}"
    rules = re.search(r"^workflow/rules/\s+(.*)$", block, flags=re.M).group(1)
    listed = set(re.findall(r"\w+", rules.split("(")[0]))
    assert listed == {p.stem for p in (REPO / "workflow/rules").glob("*.smk")}


def test_the_bf16_speed_up_is_the_measured_one():
    results = (REPO / "benchmarks/RESULTS.md").read_text()
    measured = re.search(r"^\| training tokens/s \| [\d,]+ \| [\d,]+ \| \*\*(\d\.\d+)\*\* \|$", results, flags=re.M)
    assert measured, "benchmarks/RESULTS.md: no bf16 / fp32 training row"
    ratio = measured.group(1)
    code = sorted((REPO / "src").rglob("*.py"))  # wherever the library keeps its device code
    quoting_code = [p for p in code if re.search(r"\d\.\d+x\s+a\s+training\s+step", p.read_text())]
    assert quoting_code, "no module under src/ quotes the bf16 speed-up"
    for page in (README, REPO / "config/README.md", REPO / "docs/method.md", *quoting_code):
        text = page.read_text()
        quoted = set(re.findall(r"(\d\.\d+)x\s+(?:the\s+fp32\s+training\s+speed|slower|a\s+training\s+step)", text))
        assert quoted, f"{page.relative_to(REPO)} does not quote the bf16 speed-up"
        assert quoted == {ratio}, f"{page.relative_to(REPO)} quotes {quoted}, benchmarks/RESULTS.md measured {ratio}"


def test_the_readme_is_a_front_door():
    """No dated notes or issue numbers (docs/changelog.md has them), a table of contents, and short."""
    text = README.read_text()
    assert not re.findall(r"\bissues? \d+|\b20\d\d-\d\d-\d\d\b", text), "move dated notes to docs/changelog.md"
    assert "## Contents" in text
    assert len(text.splitlines()) <= 260, "README.md is a front door; move detail to docs/"


def test_the_library_layout_names_the_subpackages():
    """README's src line and docs/method.md's "Layout of the library" name what src/headcount has."""
    library = REPO / "src/headcount"
    if not (library / "models").is_dir():
        pytest.skip("this tree still has the flat src/headcount the subpackage layout replaces")
    line = re.search(r"^src/headcount/\s+(.*\n(?:\s+.*\n)*?)(?=\S)", README.read_text(), flags=re.M).group(1)
    named = set(re.findall(r"(\w+)/", line.split("(")[0]))
    assert named == {p.name for p in library.iterdir() if (p / "__init__.py").is_file()}
    block = (REPO / "docs/method.md").read_text().split("## Layout of the library", 1)[1]
    (layout,) = fenced_blocks(block, "")[:1]
    for entry in re.findall(r"^  (\w+)/", layout, flags=re.M):
        assert (library / entry).is_dir(), f"docs/method.md names {entry}/, which src/headcount lacks"
    for entry in re.findall(r"^  (\w+(?:, \w+)*)\s{2,}", layout, flags=re.M):
        for module in entry.split(", "):
            assert (library / f"{module}.py").is_file(), f"docs/method.md names {module}, which src/headcount lacks"


# --------------------------------------------------------------------------------------------
# Provenance: every published table names the config and the commits that made it, and the
# README's headline numbers come from tables whose config still ships the experiment as it ran


PROVENANCE = REPO / "docs/tables/provenance.tsv"


def provenance_rows() -> dict[str, dict]:
    lines = PROVENANCE.read_text().splitlines()
    header = lines[0].split("\t")
    assert header == ["file", "config", "experiment", "commits"], header
    return {row["file"]: row for row in (dict(zip(header, line.split("\t"))) for line in lines[1:] if line)}


def commit_ends(commits: str) -> list[str]:
    """'a..b' or 'a', less the note publish_results adds to a run with uncommitted changes."""
    return [c for c in commits.split(" (")[0].split("..") if c]


def config_at(commit: str | None, path: str) -> dict:
    if commit is None:
        return yaml.safe_load((REPO / path).read_text())
    text = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{path}"], capture_output=True, text=True,
                          check=True).stdout
    return yaml.safe_load(text)


def untraced(tables: list[str], rows: dict[str, dict]) -> list[str]:
    """Why each of `tables` (docs/tables/... paths) does not trace to a shipped config: no provenance
    row, or a config that no longer holds its experiments (and the defaults) as they were at the
    row's last commit."""
    problems = []
    for table in tables:
        row = rows.get(table.removeprefix("docs/"))
        if row is None:
            problems.append(f"{table} has no row in docs/tables/provenance.tsv")
            continue
        if not commit_ends(row["commits"]):
            problems.append(f"{table}: provenance.tsv names no commit")
            continue
        then, now = config_at(commit_ends(row["commits"])[-1], row["config"]), config_at(None, row["config"])
        for name in row["experiment"].split(","):
            if now.get("experiments", {}).get(name) != then.get("experiments", {}).get(name):
                problems.append(f"{table}: {row['config']} no longer holds experiment {name} as it was at "
                                f"{commit_ends(row['commits'])[-1]} (git show {commit_ends(row['commits'])[-1]}:"
                                f"{row['config']})")
        if now.get("defaults") != then.get("defaults"):
            problems.append(f"{table}: {row['config']}'s defaults changed since {commit_ends(row['commits'])[-1]}")
    return problems


@pytest.mark.slow
def test_every_published_table_names_a_shipped_config_and_commits_that_exist():
    rows = provenance_rows()
    tables = {f"tables/{p.name}" for p in (REPO / "docs/tables").iterdir() if p.is_file()} - {"tables/provenance.tsv"}
    assert not tables - set(rows), f"docs/tables/provenance.tsv lacks {sorted(tables - set(rows))}"
    for row in rows.values():
        assert (REPO / row["config"]).is_file(), f"provenance.tsv: {row['file']} names {row['config']}, not shipped"
        assert commit_ends(row["commits"]), f"provenance.tsv: {row['file']} names no commit"
        for commit in commit_ends(row["commits"]):
            found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"])
            assert found.returncode == 0, f"provenance.tsv: {row['file']} names {commit}, which git does not have"


@pytest.mark.slow
def test_every_headline_number_traces_to_a_shipped_config():
    """The tables README's headline cites were made with a config that still holds their experiment
    as it ran (so `make run` rebuilds them), and the README says which config and commits."""
    rows = provenance_rows()
    cited = sorted({t for line in headline_lines() for t in re.findall(r"\]\((docs/tables/[^)]+)\)", line)})
    assert cited, "README.md's headline cites no table"
    problems = untraced(cited, rows)
    assert not problems, "README.md headline numbers without provenance:\n  " + "\n  ".join(problems)
    intro = README.read_text().split("<!-- headline numbers", 1)[0].rstrip().rsplit("\n\n", 1)[-1]
    for table in cited:
        row = rows[table.removeprefix("docs/")]
        assert row["config"] in intro and row["commits"] in intro, \
            f"README.md: the headline's introduction names neither {row['config']} nor {row['commits']}"


@pytest.mark.slow
def test_the_provenance_check_fails_a_table_whose_config_changed(tmp_path):
    rows = {"tables/x.md": {"file": "tables/x.md", "config": "config/config.yaml", "experiment": "multi30k_en_de",
                            "commits": "36797f8"}}  # the commit whose config became the amended design
    assert untraced(["docs/tables/x.md"], rows) and not untraced(
        ["docs/tables/x.md"], {"tables/x.md": {**rows["tables/x.md"], "commits": "c6bd62a..fe7d90c"}})
    assert untraced(["docs/tables/y.md"], rows) == ["docs/tables/y.md has no row in docs/tables/provenance.tsv"]


# --------------------------------------------------------------------------------------------
# Words that belong to a working day, not to the project


SESSION_WORDS = re.compile(r"\b(?:this|the next|next|the last|last|previous|every|each|a later|an earlier|"
                           r"second|third)\s+session\b|\bsession's\b|\bsessions\b|\bhelpers?\b", re.I)
WORKING_DAY = re.compile(r"\bthis machine\b", re.I)  # a user's machine is "your machine"
ISSUE_NUMBER = re.compile(r"\bissues? \d+", re.I)


def project_files() -> list[Path]:
    files = [README, *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "config").iterdir())]
    files += sorted((REPO / "src").rglob("*.py"))
    return [f for f in files if f.is_file()]


def word_problems(files: list[Path]) -> list[str]:
    problems = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(REPO)}:{number}"
            for pattern in (SESSION_WORDS, *((WORKING_DAY,) if path.suffix != ".py" else ())):
                for match in pattern.finditer(line):
                    problems.append(f"{where}: '{match.group(0)}'")
    return problems


@pytest.mark.slow
def test_no_page_comment_or_config_speaks_of_a_working_day():
    """"this session", "the next session", "this machine" (a page's working day) and "helper" mean
    nothing to a user: say what was measured where (the machine by its processor), or leave it out.
    In src/, "this machine" is the user's own (an error message's), and is allowed."""
    problems = word_problems(project_files())
    assert not problems, "working-day words:\n  " + "\n  ".join(problems)


def test_no_issue_number_in_code_or_config():
    """docs/changelog.md keeps issue numbers; code, its comments and the config say why, not which issue."""
    files = [*sorted((REPO / "src").rglob("*.py")), *sorted((REPO / "workflow").rglob("*.smk")),
             *sorted((REPO / "config").glob("*.yaml")), REPO / "Snakefile"]
    problems = [f"{path.relative_to(REPO)}:{n}: {m.group(0)}" for path in files if path.is_file()
                for n, line in enumerate(path.read_text().splitlines(), 1) for m in ISSUE_NUMBER.finditer(line)]
    assert not problems, "issue numbers in code or config:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("line, bad", [
    ("the next session got another machine", True),
    ("measured this session on 2 cores", True),
    ("a helper ran the grid", True),
    ("on this machine bf16 trains 2.6x faster", True),
    ("the Linux session is a scheduling group", False),
    ("on your machine, set a mirror", False),
])
def test_the_word_check_finds_a_working_day(tmp_path, line, bad):
    page = tmp_path / "page.md"
    page.write_text(line + "\n")
    assert bool(word_problems_in(page)) == bad


def word_problems_in(path: Path) -> list[str]:
    return [m.group(0) for line in path.read_text().splitlines()
            for pattern in (SESSION_WORDS, WORKING_DAY) for m in pattern.finditer(line)]
