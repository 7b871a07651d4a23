"""Structured outputs and tool calls through the official `openai` client.

Run by server/tests/structured_openai.rs against a live server on SmolLM2:
    python3 structured_openai.py BASE_URL API_KEY MODEL
Needs: pip install openai jsonschema
Prints one line per check; exits non-zero on the first failure.
"""

import json
import re
import sys

import jsonschema
import openai

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=BASE, api_key=KEY, max_retries=0, timeout=600)

SCHEMAS = [
    ("person", {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20},
                       "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"], "additionalProperties": False}),
    ("nested", {
        "type": "object",
        "properties": {"user": {"type": "object",
                                "properties": {"id": {"type": "integer"},
                                               "email": {"type": "string", "maxLength": 30}},
                                "required": ["id", "email"], "additionalProperties": False},
                       "active": {"type": "boolean"}},
        "required": ["user", "active"], "additionalProperties": False}),
    ("bounded_array", {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                "minItems": 2, "maxItems": 3}},
        "required": ["tags"], "additionalProperties": False}),
    ("enum", {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]},
                       "size": {"type": "string", "enum": ["S", "M", "L"]}},
        "required": ["color", "size"], "additionalProperties": False}),
    ("ranged_numbers", {
        "type": "object",
        "properties": {"temperature": {"type": "number", "minimum": -50, "maximum": 50},
                       "count": {"type": "integer", "exclusiveMinimum": 0, "maximum": 10}},
        "required": ["temperature", "count"], "additionalProperties": False}),
    ("pattern", {
        "type": "object",
        "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                       "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["zip", "code"], "additionalProperties": False}),
    ("any_of", {
        "type": "object",
        "properties": {"value": {"anyOf": [{"type": "integer", "maximum": 1000},
                                           {"type": "string", "maxLength": 10}]}},
        "required": ["value"], "additionalProperties": False}),
    ("optional_fields", {
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 20},
                       "subtitle": {"type": "string", "maxLength": 20},
                       "pages": {"type": "integer", "minimum": 1, "maximum": 999}},
        "required": ["title"], "additionalProperties": False}),
    ("array_of_objects", {
        "type": "object",
        "properties": {"items": {"type": "array", "maxItems": 3, "minItems": 1,
                                 "items": {"type": "object",
                                           "properties": {"sku": {"type": "string", "maxLength": 6},
                                                          "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                                           "required": ["sku", "qty"],
                                           "additionalProperties": False}}},
        "required": ["items"], "additionalProperties": False}),
    ("const_and_null", {
        "type": "object",
        "properties": {"version": {"const": 2},
                       "note": {"type": ["string", "null"], "maxLength": 15}},
        "required": ["version", "note"], "additionalProperties": False}),
]


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)
    if not ok:
        sys.exit(1)


def messages(what):
    return [{"role": "user", "content": f"Give me a JSON example of {what}."}]


def json_schema_checks():
    for name, schema in SCHEMAS:
        rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
        r = client.chat.completions.create(model=MODEL, messages=messages(name),
                                           response_format=rf, max_tokens=200, temperature=0)
        text = r.choices[0].message.content
        try:
            jsonschema.validate(json.loads(text), schema)
            good = r.choices[0].finish_reason == "stop"
        except Exception as e:  # noqa: BLE001 - the detail is printed
            good, text = False, f"{text!r}: {e}"
        check(f"json_schema {name} (full)", good, text)
        stream = client.chat.completions.create(model=MODEL, messages=messages(name),
                                                response_format=rf, max_tokens=200,
                                                temperature=0.8, seed=7, stream=True)
        parts, finish = [], None
        for chunk in stream:
            for c in chunk.choices:
                parts.append(c.delta.content or "")
                finish = c.finish_reason or finish
        text = "".join(parts)
        try:
            jsonschema.validate(json.loads(text), schema)
            good = finish == "stop"
        except Exception as e:  # noqa: BLE001
            good, text = False, f"{text!r}: {e}"
        check(f"json_schema {name} (stream, sampled)", good, text)


def completions_check():
    schema = SCHEMAS[0][1]
    r = client.completions.create(model=MODEL, prompt="A person as JSON:", max_tokens=100,
                                  extra_body={"guided_json": schema})
    text = r.choices[0].text
    jsonschema.validate(json.loads(text), schema)
    check("completions guided_json", True)
    shots = '{"name": "Ann", "age": 31}\n{"name": "Bob", "age": 40}\n'
    r = client.completions.create(model=MODEL, prompt=shots, max_tokens=200, temperature=0,
                                  extra_body={"response_format": {"type": "json_object"}})
    text = r.choices[0].text
    try:
        good = isinstance(json.loads(text), dict) and r.choices[0].finish_reason == "stop"
    except ValueError as e:
        good, text = False, f"{text!r} ({r.choices[0].finish_reason}): {e}"
    check("completions json_object", good, text)


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20},
                   "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                      "parameters": {"type": "object",
                                                     "properties": {"a": {"type": "integer"},
                                                                    "b": {"type": "integer"}},
                                                     "required": ["a", "b"],
                                                     "additionalProperties": False}}},
]


def tool_checks():
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS,
                                       tool_choice=named, max_tokens=100, temperature=0)
    c = r.choices[0]
    calls = c.message.tool_calls or []
    good = (len(calls) == 1 and calls[0].function.name == "get_weather"
            and c.finish_reason == "tool_calls")
    check("named tool_choice returns tool_calls", good, str(c))
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)
    check("named tool_choice arguments validate", True)

    stream = client.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS,
                                            tool_choice=named, max_tokens=100,
                                            temperature=0, stream=True)
    args, name, finish = "", None, None
    for chunk in stream:
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                name = tc.function.name or name
                args += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    jsonschema.validate(json.loads(args), WEATHER)
    check("named tool_choice streamed as delta.tool_calls",
          name == "get_weather" and finish == "tool_calls", f"{name} {finish}")

    r = client.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS,
                                       tool_choice="required", max_tokens=150, temperature=0)
    calls = r.choices[0].message.tool_calls or []
    good = len(calls) >= 1 and r.choices[0].finish_reason == "tool_calls"
    check("required tool_choice returns tool_calls", good, str(r.choices[0]))
    for call in calls:
        params = next(t["function"]["parameters"] for t in TOOLS
                      if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), params)
    check("required tool_choice arguments validate", True)

    stream = client.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS,
                                            tool_choice="required", max_tokens=150,
                                            temperature=0, stream=True)
    streamed, finish = [], None
    for chunk in stream:
        for ch in chunk.choices:
            streamed.extend(ch.delta.tool_calls or [])
            finish = ch.finish_reason or finish
    good = len(streamed) >= 1 and finish == "tool_calls" and all(
        tc.function.name in ("get_weather", "add") for tc in streamed)
    check("required tool_choice streamed as delta.tool_calls", good, f"{streamed} {finish}")

    history = ask + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather",
                                      "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                       tool_choice="none", max_tokens=30, temperature=0)
    check("tool history renders and answers", r.choices[0].message.content is not None)


def structured_outputs_checks():
    q = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
    choices = ["yes", "no", "maybe not"]
    for field, body in [("structured_outputs", {"structured_outputs": {"choice": choices}}),
                        ("guided_choice", {"guided_choice": choices})]:
        r = client.chat.completions.create(model=MODEL, messages=q, max_tokens=10,
                                           temperature=1.0, seed=3, extra_body=body)
        text = r.choices[0].message.content
        check(f"{field} choice", text in choices, repr(text))
    rx = r"[0-9]{3}-[0-9]{4}"
    for field, body in [("structured_outputs", {"structured_outputs": {"regex": rx}}),
                        ("guided_regex", {"guided_regex": rx})]:
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "A phone number?"}],
            max_tokens=20, temperature=1.0, seed=5, extra_body=body)
        text = r.choices[0].message.content
        check(f"{field} regex", re.fullmatch(rx, text) is not None, repr(text))
    lark = 'start: greeting " " name "!"\ngreeting: "hello" | "goodbye"\nname: /[a-z]{2,8}/'
    for field, body in [("structured_outputs", {"structured_outputs": {"grammar": lark}}),
                        ("guided_grammar", {"guided_grammar": lark})]:
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Greet someone."}],
            max_tokens=20, temperature=1.0, seed=11, extra_body=body)
        text = r.choices[0].message.content
        check(f"{field} Lark grammar", re.fullmatch(r"(hello|goodbye) [a-z]{2,8}!", text)
              is not None, repr(text))


def invalid_checks():
    cases = [
        ("invalid schema", {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "frobnicate"}}}}, "response_format"),
        ("invalid regex", {"structured_outputs": {"regex": "[a-"}}, "structured_outputs"),
        ("invalid grammar", {"structured_outputs": {"grammar": "start: nowhere"}},
         "structured_outputs"),
        ("invalid guided_regex", {"guided_regex": "(unclosed"}, "guided_regex"),
        ("two constraints", {"guided_regex": "a", "guided_choice": ["a"]}, None),
        ("unknown tool_choice", {"tools": TOOLS, "tool_choice": {"type": "function",
                                                                 "function": {"name": "nope"}}},
         "tool_choice"),
    ]
    for name, body, param in cases:
        try:
            client.chat.completions.create(model=MODEL, max_tokens=5,
                                           messages=[{"role": "user", "content": "hi"}],
                                           extra_body=body)
            check(name, False, "no error")
        except openai.BadRequestError as e:
            err = e.body if isinstance(e.body, dict) else {}
            msg = err.get("message", "")
            good = e.status_code == 400 and len(msg) > 10 and (param is None or err.get("param") == param)
            check(f"{name} -> 400 ({msg[:70]})", good, str(e.body))


SECTIONS = {"schemas": json_schema_checks, "completions": completions_check,
            "tools": tool_checks, "structured": structured_outputs_checks,
            "invalid": invalid_checks}
for section in (sys.argv[4].split(",") if len(sys.argv) > 4 else SECTIONS):
    SECTIONS[section]()
print("all structured-output checks passed")
