"""A campaign's CSV: valid files load; each kind of bad input is refused with its line, nothing loaded."""

from __future__ import annotations

import pytest

from brisvox.outbound.campaign.csvload import MAX_PROBLEMS, CsvRefused, load, normalise_number


def refused(text: str, **kw: object) -> list[tuple[int, str]]:
    with pytest.raises(CsvRefused) as e:
        load(text, **kw)  # type: ignore[arg-type]
    return e.value.problems


def test_a_valid_file_loads_every_row_normalised_with_its_line_zone_and_variables():
    text = ("\ufeffnumber,timezone,first_name\n"
            "+49 (30) 123-4567,Europe/Berlin,Ann\n"
            "\n"
            '"+1 212 555 0100",America/New_York,"Bo, Jr."\n'
            "sip:+4930999@127.0.0.1:5070,,Cy\n")
    rows = load(text, declared=["first_name"], default_timezone="Asia/Tokyo")
    assert [(r.line, r.number, r.timezone, dict(r.variables)) for r in rows] == [
        (2, "+49301234567", "Europe/Berlin", {"first_name": "Ann"}),
        (4, "+12125550100", "America/New_York", {"first_name": "Bo, Jr."}),
        (5, "sip:+4930999@127.0.0.1:5070", "Asia/Tokyo", {"first_name": "Cy"}),
    ]


def test_malformed_numbers_are_refused_with_their_lines():
    text = "number,timezone\n+4930123456,UTC\n030123456,UTC\n+49abc1234567,UTC\n+12,UTC\nsip:nohost,UTC\n"
    probs = refused(text)
    assert [n for n, _ in probs] == [3, 4, 5, 6]
    assert all("malformed number" in m for _, m in probs)


def test_a_duplicate_after_normalisation_names_both_lines():
    probs = refused("number,timezone\n+49 30 1234567,UTC\n+4930111111,UTC\n+49-30-1234567,UTC\n")
    assert probs == [(4, "duplicate of line 2 (+49301234567)")]


def test_a_bad_time_zone_is_refused_with_its_line_and_so_is_a_bad_default():
    assert refused("number,timezone\n+4930123456,Europe/Berlin\n+4930123457,Mars/Olympus\n") == [
        (3, "bad time zone 'Mars/Olympus' (an IANA name: Europe/Berlin)")]
    assert refused("number\n+4930123456\n", default_timezone="CEST")[0][0] == 0
    # no timezone column and no default: the header is refused
    assert refused("number\n+4930123456\n") == [(1, "no 'timezone' column and no --timezone default")]


def test_an_undeclared_column_is_an_unknown_variable_on_the_header_line():
    text = "\n\nnumber,timezone,account,name\n+4930123456,UTC,77,Ann\n"
    assert refused(text, declared=["name"]) == [
        (3, "unknown variable 'account' (declare it with --var account)")]
    assert len(load(text, declared=["name", "account"])) == 1


def test_structure_problems_wrong_field_counts_no_number_column_empty_files():
    assert refused("number,timezone\n+4930123456,UTC,extra\n") == [(2, "3 fields, the header has 2")]
    assert refused("phone,timezone\n+4930123456,UTC\n", declared=["phone"]) == [(1, "no 'number' column")]
    assert refused("")[0][1].startswith("empty file")
    assert refused("number,timezone\n")[0][1] == "no rows after the header"
    assert refused('number,timezone\n"+4930123456,UTC\n')[0][1].startswith("not CSV")


def test_problems_are_bounded_and_counted():
    text = "number,timezone\n" + "".join(f"bad{i},UTC\n" for i in range(50))
    with pytest.raises(CsvRefused) as e:
        load(text)
    assert len(e.value.problems) == MAX_PROBLEMS and e.value.more == 50 - MAX_PROBLEMS
    assert "and 30 more" in str(e.value)


def test_a_value_with_control_characters_or_too_long_is_refused():
    probs = refused("number,timezone,note\n+4930123456,UTC,a\x07b\n+4930123457,UTC," + "x" * 300 + "\n",
                    declared=["note"])
    assert [n for n, _ in probs] == [2, 3]


@pytest.mark.parametrize("raw,want", [("+4930123456", "+4930123456"), (" +49.30.123456 ", "+4930123456"),
                                      ("+0301234567", None), ("4930123456", None), ("+4930123456789012", None),
                                      ("sips:alice@10.0.0.1", "sips:alice@10.0.0.1"), ("sip:a b@h", None)])
def test_normalise_number(raw: str, want: str | None):
    assert normalise_number(raw) == want


def test_a_variable_may_not_take_a_name_the_gateway_sets_on_the_call_nor_exceed_its_parameters() -> None:
    from brisvox.wire.jsontext import MAX_DIAL_PARAMS

    with pytest.raises(CsvRefused, match="'to'"):
        load("number,to\n+493010001,x\n", ("to",), "UTC")
    many = [f"v{i}" for i in range(MAX_DIAL_PARAMS + 1)]
    with pytest.raises(CsvRefused, match=f"at most {MAX_DIAL_PARAMS} variables"):
        load("number," + ",".join(many) + "\n", many, "UTC")
