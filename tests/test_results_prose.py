"""The prose of docs/results.md quotes only what its tables say, and the published verdicts are
what the rules give on the published tables.

docs/results.md marks each stretch of prose with the sources its numbers come from:

    <!-- numbers from: docs/tables/pruning.tsv; docs/tables/head_roles.csv[layer=2,head=2] -->
    ...prose...
    <!-- end numbers -->

A source is a file of the repository, optionally restricted to the rows whose columns have the
values in brackets (for the config, the part the brackets name: config/config.yaml[defaults.roles]),
or an older commit's file, git:<commit>:<path>. Every decimal number in the
stretch must be in one of its sources: as written in a markdown source (which prints numbers as the
prose quotes them), as written or, with two decimals or more, rounded from a number of a data table
(.tsv, .csv, .yaml).
"differences" among the sources also accepts a number that is the difference of two numbers quoted
on the same line (an old and a new value, say), each itself in a source. A head's name (layer.head,
counted from 1: layers 1-6, heads 1-8), which the prose uses constantly, is no number: an unsigned
d.d of those digits is not checked unless a unit follows it (1.9 BLEU is a number, 1.8 a head).
Every line of the results (from "## Baseline" to the section on other models) that quotes a decimal
lies in such a stretch or in a published table. Integers (head counts, steps) are not checked.

Fast: reads files, and git for the older commits.
"""

import re
import subprocess
from io import StringIO
from pathlib import Path

import pandas as pd
import pytest
from conftest import load_script

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs/results.md"
START, END = "## Baseline, across three seeds", "## Other encoder-decoder models"
_BLOCK = re.compile(r"<!-- numbers from: (.*?) -->\n(.*?)<!-- end numbers -->", flags=re.S)
_PUBLISHED = re.compile(r"<!-- published (\S+) -->\n.*?<!-- end \1 -->", flags=re.S)
_SOURCE = re.compile(r"^(?:git:(?P<commit>[0-9a-f]{7,40}):)?(?P<path>[^\[\]]+?)(?:\[(?P<rows>[^\]]*)\])?$")
_HEAD_NAME = re.compile(r"[1-6]\.[1-8]")
_UNIT = re.compile(r"\s*(?:BLEU|nats|points|%|s\b|min|hours)")


def quoted_numbers(line: str) -> list[str]:
    """The decimal numbers of a line of prose, signed where a sign is written (a hyphen between two
    numbers is a range, not a sign); inline code, link targets, HTML comments and scientific
    notation (1.1e-3) are left out."""
    text = re.sub(r"`[^`\n]*`", " ", line)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"<!--.*?-->", " ", text)
    numbers = []
    for match in re.finditer(r"(?<![\w.])(\d+\.\d+)(?![\d.]*\d)(?![eE][+-]?\d)", text):
        start = match.start()
        sign = text[start - 1] if start and text[start - 1] in "+-" else ""
        if sign and start >= 2 and text[start - 2].isdigit():  # 0.13-0.20: a range
            sign = ""
        if not sign and _HEAD_NAME.fullmatch(match.group(1)) and not _UNIT.match(text, match.end()):
            continue  # a head's name
        numbers.append(sign + match.group(1))
    return numbers


def source_text(source: str) -> str:
    match = _SOURCE.match(source.strip())
    assert match, f"not a source: {source!r}"
    path, commit, rows = match.group("path"), match.group("commit"), match.group("rows")
    if commit:
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{path}"], capture_output=True,
                              text=True, check=True).stdout
    else:
        text = (REPO / path).read_text()
    if rows and path.endswith(".yaml"):  # a part of the config: config/config.yaml[defaults.roles]
        import yaml

        part = yaml.safe_load(text)
        for key in rows.split("."):
            part = part[key]
        return yaml.safe_dump(part)
    if rows:
        table = pd.read_csv(StringIO(text), sep="\t" if path.endswith(".tsv") else ",")
        for condition in rows.split(","):
            column, value = condition.split("=")
            table = table[table[column.strip()].astype(str) == value.strip()]
        assert len(table), f"{source}: no such rows"
        text = table.to_csv(index=False)
    return text


def found_in(number: str, text: str, exact: str = "") -> bool:
    """`number` is in `text` or `exact` as written (signed as written, or unsigned), or a number of
    `text` rounds to it; an unsigned number matches either sign."""
    if any(re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", t) for t in (text, exact)):
        return True
    decimals = len(number.split(".")[1])
    if decimals < 2:  # one decimal rounds from too many numbers of a big table to tell anything
        return False
    value = float(number)
    signed = number[0] in "+-"
    for x in re.findall(r"[+-]?\d+\.\d+(?:[eE][+-]?\d+)?|[+-]?\d+(?:[eE][+-]?\d+)?", text):
        rounded = round(float(x), decimals)
        if rounded == value or (not signed and abs(rounded) == value):
            return True
    return False


def is_difference(number: str, line_numbers: list[str], text: str, exact: str) -> bool:
    """`number` is a - b (or |a - b|) of two numbers quoted on its line that are in the sources."""
    operands = [float(n) for n in line_numbers if n != number and found_in(n, text, exact)]
    value, decimals = float(number), len(number.split(".")[1])
    tolerance = 10 ** -decimals + 1e-9  # each operand rounded in its own last place
    return any(abs((a - b) - value) <= tolerance or (number[0] not in "+-" and abs(abs(a - b) - value) <= tolerance)
               for a in operands for b in operands)


def blocks(text: str) -> list[tuple[list[str], str]]:
    return [([s for s in sources.split(";") if s.strip()], body) for sources, body in _BLOCK.findall(text)]


def problems_of(text: str) -> list[str]:
    problems = []
    for sources, body in blocks(text):
        differences = any(s.strip() == "differences" for s in sources)
        cited = [s for s in sources if s.strip() != "differences"]
        pages = "\n".join(source_text(s) for s in cited if re.sub(r"\[.*", "", s.strip()).endswith(".md"))
        tables = "\n".join(source_text(s) for s in cited if not re.sub(r"\[.*", "", s.strip()).endswith(".md"))
        for line in body.splitlines():
            numbers = quoted_numbers(line)
            for number in numbers:
                if found_in(number, tables, pages):
                    continue
                if differences and is_difference(number, numbers, tables, pages):
                    continue
                problems.append(f"{number} is in none of {'; '.join(sources)}: {line.strip()[:90]}")
    return problems


def results_part(text: str) -> str:
    assert START in text and END in text, f"docs/results.md lacks '{START}' or '{END}'"
    return text[text.index(START):text.index(END)]


def test_every_number_in_the_results_prose_is_in_a_table_it_cites():
    text = results_part(RESULTS.read_text())
    assert len(blocks(text)) >= 10
    problems = problems_of(text)
    assert not problems, "docs/results.md:\n  " + "\n  ".join(problems)


def test_every_line_that_quotes_a_decimal_cites_its_tables():
    text = results_part(RESULTS.read_text())
    bare = _BLOCK.sub("", _PUBLISHED.sub("", text))
    bare = re.sub(r"^```.*?^```", "", bare, flags=re.S | re.M)
    uncited = [line.strip()[:90] for line in bare.splitlines()
               if not line.startswith("#") and quoted_numbers(line)]
    assert not uncited, "docs/results.md: lines quoting numbers outside a 'numbers from' stretch:\n  " + \
        "\n  ".join(uncited)


OLD = "git:c7aad62:docs/tables"  # the tables of the publication issue 40 read


@pytest.mark.parametrize("prose, sources, ok", [
    # the mismatches issue 40 found, against the rows they cite, in the tables of that publication
    ("0.42 on word-initial pieces, 0.33 on continuation pieces", f"{OLD}/head_roles.csv[layer=2,head=2]", False),
    ("0.42 on word-initial pieces, 0.32 on continuation pieces", f"{OLD}/head_roles.csv[layer=2,head=2]", True),
    ("the old recipe's control lost 1.9 BLEU", "docs/method.md", False),
    ("the old recipe's control lost -1.20 [-2.22, -0.24]", "docs/method.md", True),
    ("a gap of +4.01 [+3.02, +5.00]", f"{OLD}/pruning_enc.md", True),
    ("LRP 0.32 -> 0.67", f"git:52840e3:docs/tables/head_correlations.tsv; {OLD}/head_correlations.tsv", True),
    ("baseline 36.67 -> 36.87, +0.20", f"git:52840e3:docs/tables/pruning.tsv; {OLD}/pruning.tsv", False),
    ("baseline 36.67 -> 36.87, +0.20", f"git:52840e3:docs/tables/pruning.tsv; {OLD}/pruning.tsv; differences", True),
    ("a range 0.13-0.20 and heads 6.1 and 3.3", f"{OLD}/head_scores.csv", True),
])
def test_the_checker_finds_a_number_its_table_does_not_have(prose, sources, ok):
    text = f"<!-- numbers from: {sources} -->\n{prose}\n<!-- end numbers -->\n"
    assert (not problems_of(text)) == ok, problems_of(text)


def test_quoted_numbers_reads_signs_ranges_and_leaves_out_code_and_links():
    line = "-0.21 [-0.86, +0.47], 0.13-0.20, `1.23`, [t](tables/x.5.tsv), 1.1e-3, v2.6.0 <!-- 9.99 -->"
    assert quoted_numbers(line) == ["-0.21", "-0.86", "+0.47", "0.13", "0.20"]


# --------------------------------------------------------------------------------------------
# The published verdicts and the tables they read


def test_the_published_claims_are_the_rules_on_the_published_tables():
    """docs/tables/pruning_claims.md is what headcount.report.claims gives on docs/tables (a change
    of rules must republish it: tools/republish_claims.py)."""
    expected = load_script(REPO / "tools/republish_claims.py").claims_from_tables(REPO / "docs/tables")
    assert (REPO / "docs/tables/pruning_claims.md").read_text() == expected, "run tools/republish_claims.py"


@pytest.mark.parametrize("survival, pruning", [
    ("layer_survival.tsv", "pruning.tsv"),
])
def test_the_layer_survival_table_adds_up_to_the_pruning_table(survival, pruning):
    """Heads kept per type and, in the encoder, per role, summed over layers, are pruning.tsv's
    counts for every run the table records (docs/tables/layer_survival.tsv was reconstructed for the
    2026-11-24 run; a run writes it whole)."""
    layers = pd.read_csv(REPO / "docs/tables" / survival, sep="\t")
    table = pd.read_csv(REPO / "docs/tables" / pruning, sep="\t")
    checked = 0
    for (setting, lam, kind), rows in layers.groupby(["setting", "lam", "type"]):
        run = table[(table["setting"] == setting) & (table["lam"] == lam)]
        assert len(run) == 1, (setting, lam)
        assert rows["kept"].sum() == run[f"retained_{kind}"].item(), (setting, lam, kind)
        assert (rows.groupby("layer")["heads"].sum() == 8).all()
        if kind == "enc_self":
            for role, kept in rows.groupby("role")["kept"].sum().items():
                assert kept == run[f"role_{role}"].item(), (setting, lam, role)
        checked += 1
    assert checked >= 20


def test_the_controls_layer_survival_is_its_gate_order():
    """The control's table against the open counts control_planted_vs_found.md publishes."""
    layers = pd.read_csv(REPO / "docs/tables/control_layer_survival.tsv", sep="\t")
    order = (REPO / "docs/tables/control_planted_vs_found.md").read_text()
    enc = layers[layers["type"] == "enc_self"]
    for (setting, lam), rows in enc.groupby(["setting", "lam"]):
        role = rows["role"] != "none"
        cells = (f"| {setting} | {lam:g} | {rows['kept'].sum()}/{rows['heads'].sum()} | "
                 f"{rows.loc[role, 'kept'].sum()}/{rows.loc[role, 'heads'].sum()} | "
                 f"{rows.loc[~role, 'kept'].sum()}/{rows.loc[~role, 'heads'].sum()} |")
        assert cells in order, cells


# docs/results_lm.md (the real pretrained models, issue 58) is held to the same rule, the whole page:
# a head's name there is written as code (`18.6`), and the literature's numbers are cited from
# docs/literature_lm.yaml.
RESULTS_LM = REPO / "docs/results_lm.md"


def test_every_number_in_the_language_model_results_is_in_a_table_it_cites():
    text = RESULTS_LM.read_text()
    assert len(blocks(text)) >= 4
    problems = problems_of(text)
    assert not problems, "docs/results_lm.md:\n  " + "\n  ".join(problems)
    bare = _BLOCK.sub("", _PUBLISHED.sub("", text))
    bare = re.sub(r"^```.*?^```", "", bare, flags=re.S | re.M)
    uncited = [line.strip()[:90] for line in bare.splitlines() if not line.startswith("#") and quoted_numbers(line)]
    assert not uncited, "docs/results_lm.md: lines quoting numbers outside a 'numbers from' stretch:\n  " + \
        "\n  ".join(uncited)
