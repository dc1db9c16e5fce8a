"""Every crash-matrix row (tests/crash/rows.py, rendered as docs/crash-matrix.md) is decided
by some entry of the step-kind table: a kind's `rows`, or `CROSS_KIND_ROWS` for the rows
about any step. A kind claims only rows whose text names it, so a claim can be checked."""

from __future__ import annotations

from dex_ha.engine.kinds import CROSS_KIND_ROWS, STEP_KINDS
from tests.crash.rows import ROWS


def claimed_rows() -> dict[str, list[str]]:
    """Row id → who claims it (kind names, or "cross-kind")."""
    claims: dict[str, list[str]] = {}
    for spec in STEP_KINDS.values():
        for row in spec.rows:
            claims.setdefault(row, []).append(spec.kind)
    for row in CROSS_KIND_ROWS:
        claims.setdefault(row, []).append("cross-kind")
    return claims


def test_the_matrix_has_rows_r01_to_r21() -> None:
    assert sorted(ROWS) == [f"R{n:02d}" for n in range(1, 22)]


def test_every_row_is_claimed() -> None:
    unclaimed = sorted(set(ROWS) - set(claimed_rows()))
    assert unclaimed == [], "each crash-matrix row needs a kind (or CROSS_KIND_ROWS) that decides it"


def test_no_claim_names_a_row_the_matrix_lacks() -> None:
    assert sorted(set(claimed_rows()) - set(ROWS)) == []


def test_a_kind_claims_only_rows_that_name_it() -> None:
    wrong = [
        f"{spec.kind} claims {row}"
        for spec in STEP_KINDS.values()
        for row in spec.rows
        if spec.kind not in f"{ROWS[row].step} {ROWS[row].happens}"
    ]
    assert wrong == []


def test_cross_kind_rows_are_about_any_step_and_no_kind_claims_them() -> None:
    assert all(ROWS[row].step.startswith("any ") for row in CROSS_KIND_ROWS)
    assert {
        row: kinds for row, kinds in claimed_rows().items() if row in CROSS_KIND_ROWS and kinds != ["cross-kind"]
    } == {}
