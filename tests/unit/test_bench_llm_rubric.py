"""The local-LLM benchmark's rubric: each check judges what it says, on answers seen from real models."""

from __future__ import annotations

from bench.llm_rubric import QUESTIONS, S1_CITIES, is_english, is_plain, s1_calls, s1_passed, score


def test_a_good_phone_answer_scores_four() -> None:
    assert score("The capital of France is Paris.", ("paris",)).total == 4
    assert score("Water boils at 100 degrees Celsius.", ("100", "hundred")).total == 4
    assert score("Cold.", ("cold",)).total == 4


def test_each_check_fails_on_its_own_fault() -> None:
    # SmolLM2's answers (bench runs, 2026-12-01) and an earlier garbled one ("Lagrange ...")
    s = score("Le Grand Paris - la femme de la France.", ("paris",))
    assert (s.answers, s.english) == (1, 0)
    assert not is_english("Lagrange Paris Lagrange France Lagrange Bayantou frac")
    assert score("The month after June is December.", ("july",)).answers == 0
    assert score("A spider has four legs.", ("eight", "8")).answers == 0
    long = "I can help. " * 3
    assert score(long, ("help",)).short == 0  # three sentences
    assert score("Sure:\n- one\n- two", ("one",)).plain == 0
    assert not is_plain("**Paris** is the capital.") and not is_plain("Paris 🇫🇷")
    assert is_plain("Water freezes at 0°C.")


def test_the_question_set_is_fixed_and_judgeable() -> None:
    assert len(QUESTIONS) == 20 and len({q for q, _ in QUESTIONS}) == 20
    assert all(accepted and all(a == a.lower() for a in accepted) for _, accepted in QUESTIONS)


def test_s1_reads_well_formed_calls_only() -> None:
    qwen = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Izmir"}}\n</tool_call>')
    assert s1_passed(s1_calls(qwen)) and sorted(c.lower() for c in s1_calls(qwen)) == sorted(S1_CITIES)
    # the 0.5B's one call with a repeated key is one call (JSON keeps the last city): failed
    merged = '{"name": "get_weather", "arguments": {"city": "Paris", "city": "Rome", "city": "Izmir"}}'
    assert s1_calls(merged) == ["Izmir"] and not s1_passed(s1_calls(merged))
    assert s1_calls("Paris: 20°C, Rome: 8°C, Izmir: 20°C") == []  # an invented answer, no call
    assert s1_calls('{"name": "get_weather", "arguments": {"city": "Rome", "units": "C"}}') == []
