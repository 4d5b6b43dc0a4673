#!/usr/bin/env python3
"""Structured output and tool calling on the demo model (SmolLM2-135M-Instruct, its real 49,152-token
vocabulary), through the official `openai` package, sampled at temperature 1 with max_tokens 512:
- 50+ JSON schemas covering the supported keywords: every output parses and validates with the
  `jsonschema` package (PyPI, pinned in tests/e2e/openai-requirements.txt); a `length` finish fails;
- regular expressions (vLLM's guided_regex) and GBNF grammars (guided_grammar): every output matches
  (a Python regex equivalent of each grammar);
- response_format json_schema: 100 of 100 sampled tries valid;
- forced tool calls (tool_choice a named function, and "required"), plain and streamed: the call
  parses into the named function with arguments valid under its parameters schema; tool and
  assistant tool_calls messages are accepted;
- refusals: an unsupported keyword (400 naming it), a hostile schema (deep nesting, a huge enum) and
  a catastrophic pattern are refused.
Requests run concurrently (the engine batches them). Skips (exit 77) without the demo model.
"""

import argparse
import concurrent.futures
import json
import os
import re
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402

PROMPT = "Answer with one JSON value for a record about a city, a person or a book."

# (name, schema): together they use every keyword frontends.h lists.
SCHEMAS = [
    ("string", {"type": "string", "maxLength": 40}),
    ("string_min_max", {"type": "string", "minLength": 3, "maxLength": 8}),
    ("integer", {"type": "integer"}),
    ("integer_range", {"type": "integer", "minimum": 10, "maximum": 99}),
    ("integer_negative", {"type": "integer", "minimum": -50, "maximum": -5}),
    ("integer_exclusive", {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 7}),
    ("number", {"type": "number"}),
    ("number_range", {"type": "number", "minimum": -1.5, "maximum": 2.5}),
    ("number_exclusive", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}),
    ("boolean", {"type": "boolean"}),
    ("null", {"type": "null"}),
    ("nullable_string", {"type": ["string", "null"], "maxLength": 20}),
    ("enum_strings", {"enum": ["red", "green", "blue"]}),
    ("enum_mixed", {"enum": ["a", 1, 2.5, True, None, {"k": [1]}]}),
    ("const", {"const": "fixed value"}),
    ("const_object", {"const": {"a": [1, 2], "b": None}}),
    ("pattern", {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}),
    ("pattern_alternation", {"type": "string", "pattern": "^(cat|dog|bird)s?$"}),
    ("pattern_escapes", {"type": "string", "pattern": "^\\d{2}\\.\\w{1,4}\\s?[\"']?$"}),
    ("format_date", {"type": "string", "format": "date"}),
    ("format_time", {"type": "string", "format": "time"}),
    ("format_date_time", {"type": "string", "format": "date-time"}),
    ("format_uuid", {"type": "string", "format": "uuid"}),
    ("format_email", {"type": "string", "format": "email"}),
    ("format_ipv4", {"type": "string", "format": "ipv4"}),
    ("object_required", {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0,
                                                            "maximum": 120}},
        "required": ["name", "age"], "additionalProperties": False}),
    ("object_optional", {"type": "object", "properties": {
        "a": {"type": "boolean"}, "b": {"type": "integer"}, "c": {"type": "string", "maxLength": 5}},
        "additionalProperties": False}),
    ("object_mixed_required", {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "number"}, "label": {"type": "string",
                                                                    "maxLength": 10}},
        "required": ["y"], "additionalProperties": False}),
    ("object_implicit_type", {"properties": {"id": {"type": "integer"}}, "required": ["id"]}),
    ("object_required_untyped", {"type": "object", "required": ["anything"]}),
    ("object_empty_closed", {"type": "object", "additionalProperties": False}),
    ("object_map", {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0,
                                                               "maximum": 9}}),
    ("object_nested", {"type": "object", "properties": {
        "city": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 20},
            "population": {"type": "integer", "minimum": 0}},
            "required": ["name", "population"], "additionalProperties": False},
        "country": {"type": "string", "maxLength": 20}},
        "required": ["city", "country"], "additionalProperties": False}),
    ("array", {"type": "array", "items": {"type": "integer"}, "maxItems": 5}),
    ("array_min_max", {"type": "array", "items": {"type": "string", "maxLength": 6},
                       "minItems": 2, "maxItems": 3}),
    ("array_exact", {"type": "array", "items": {"type": "boolean"}, "minItems": 3,
                     "maxItems": 3}),
    ("array_empty", {"type": "array", "maxItems": 0}),
    ("array_of_objects", {"type": "array", "items": {
        "type": "object", "properties": {"k": {"enum": ["a", "b"]}, "v": {"type": "number"}},
        "required": ["k", "v"], "additionalProperties": False}, "minItems": 1, "maxItems": 3}),
    ("array_untyped_items", {"type": "array", "minItems": 1, "maxItems": 2,
                             "items": {"type": ["integer", "boolean"]}}),
    ("prefix_items", {"type": "array", "prefixItems": [{"type": "string", "maxLength": 8},
                                                       {"type": "integer"}],
                      "items": False}),
    ("prefix_items_more", {"type": "array", "prefixItems": [{"const": "head"}],
                           "items": {"type": "integer", "minimum": 0, "maximum": 9},
                           "maxItems": 4}),
    ("any_of", {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 10},
                          {"type": "string", "maxLength": 10}]}),
    ("any_of_objects", {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
         "required": ["kind", "r"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number"}},
         "required": ["kind", "side"], "additionalProperties": False}]}),
    ("all_of_one", {"allOf": [{"type": "object", "properties": {"q": {"type": "boolean"}},
                               "required": ["q"], "additionalProperties": False}]}),
    ("ref_defs", {"$defs": {"point": {"type": "object", "properties": {
        "x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"],
        "additionalProperties": False}},
        "type": "object", "properties": {"from": {"$ref": "#/$defs/point"},
                                         "to": {"$ref": "#/$defs/point"}},
        "required": ["from", "to"], "additionalProperties": False}),
    ("ref_definitions", {"definitions": {"color": {"enum": ["cyan", "magenta"]}},
                         "type": "array", "items": {"$ref": "#/definitions/color"},
                         "maxItems": 3}),
    # $refs through $refs (a recursive schema nests as deep as the model likes at temperature 1:
    # recursion is tested on the grammar, tests/engine/structured).
    ("ref_nested", {"$defs": {
        "leaf": {"type": "integer", "minimum": 0, "maximum": 9},
        "pair": {"type": "array", "prefixItems": [{"$ref": "#/$defs/leaf"},
                                                  {"$ref": "#/$defs/leaf"}], "items": False}},
        "type": "object", "properties": {"a": {"$ref": "#/$defs/pair"},
                                         "b": {"$ref": "#/$defs/pair"}},
        "required": ["a", "b"], "additionalProperties": False}),
    ("annotations", {"title": "T", "description": "d", "$schema":
                     "https://json-schema.org/draft/2020-12/schema", "$comment": "c",
                     "type": "object", "properties": {"v": {"type": "integer", "default": 1,
                                                            "examples": [1, 2]}},
                     "required": ["v"], "additionalProperties": False}),
    ("any_value", {}),
    ("true_schema", True),
    ("unicode_enum", {"enum": ["café", "naïve", "日本", "€"]}),
    ("escaped_keys", {"type": "object", "properties": {"a \"quoted\" key": {"type": "boolean"},
                                                       "line\nbreak": {"type": "null"}},
                      "required": ["a \"quoted\" key", "line\nbreak"],
                      "additionalProperties": False}),
    ("openai_strict_style", {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": ["integer", "null"]},
        "genres": {"type": "array", "items": {"type": "string",
                                              "enum": ["fiction", "history", "science"]},
                   "maxItems": 3},
        "rating": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 5}, {"type": "null"}]}},
        "required": ["title", "year", "genres", "rating"], "additionalProperties": False}),
    ("string_plain", {"type": "string"}),
]

# (pattern, vLLM's guided_regex), checked with re.fullmatch. Words are bounded: at temperature 1
# the demo model can spell one unbounded word past max_tokens (a `length` finish; CI of 2026-11-27
# met one 1,400 characters long), which says nothing of the constraint.
REGEXES = [
    r"\d{3}-\d{4}",
    r"(yes|no|maybe)",
    r"[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8})?",
    r"(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})",
    r"[a-z]{1,12}@[a-z]{1,12}\.(com|org)",
    r"#[0-9a-fA-F]{6}",
    r"(\w{1,16}, ){1,3}\w{1,16}\.",
    r"[^\n]{1,30}!",
]

# (GBNF, an equivalent Python regex for the check).
GRAMMARS = [
    ('root ::= "The answer is " ("yes" | "no") "."\n', r"The answer is (yes|no)\."),
    ('root ::= num ("+" num){0,4}\nnum ::= [1-9] [0-9]?\n',
     r"[1-9][0-9]?(\+[1-9][0-9]?){0,4}"),
    ('root ::= "[" item ("," item){0,3} "]"\nitem ::= "\\"" [a-z]{1,5} "\\""\n',
     r'\["[a-z]{1,5}"(,"[a-z]{1,5}"){0,3}\]'),
    ('# a date\nroot ::= year "-" month\nyear ::= "19" [0-9] [0-9] | "20" [0-2] [0-9]\n'
     'month ::= "0" [1-9] | "1" [0-2]\n', r"(19[0-9][0-9]|20[0-2][0-9])-(0[1-9]|1[0-2])"),
    ('root ::= word (" " word)? "."\nword ::= [a-zA-Z]{1,16}\n',
     r"[a-zA-Z]{1,16}( [a-zA-Z]{1,16})?\."),
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
            "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
            "required": ["a", "b"], "additionalProperties": False}}},
]


def demo_model():
    path = os.environ.get("LMSERVE_DEMO_MODEL")
    if not path:
        cache = os.environ.get("LMSERVE_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lmserve")
        path = os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


class Checks:
    def __init__(self):
        self.failures = []
        self.passed = 0

    def expect(self, condition, message):
        if condition:
            self.passed += 1
        else:
            self.failures.append(message)
            print("FAIL:", message, flush=True)


def chat(client, model, seed, content=PROMPT, **kwargs):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], temperature=1.0,
        max_tokens=512, seed=seed, **kwargs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--fixtures-dir", required=True)
    args = parser.parse_args()
    try:
        import jsonschema
        import openai
    except ImportError as error:
        print(f"SKIP: {error} (scripts/openai-venv.sh installs the test's packages)")
        return 77
    model = demo_model()
    if model is None:
        print("SKIP: no demo model (scripts/fetch-demo-model.sh)")
        return 77

    checks = Checks()
    server = e2e_util.Server(args.build_dir, [
        "--model", model, "--kv-cache-mb", "256", "--http-port", "0", "--max-num-seqs", "48",
        "--max-step-slowdown", "off"], timeout=120)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1",
                               api_key="unused", max_retries=0, timeout=600)
        served = client.models.list().data[0].id
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=48)

        # ---- JSON schemas: every output valid.
        def run_schema(index, name, schema):
            reply = chat(client, served, 1000 + index, response_format={
                "type": "json_schema", "json_schema": {"name": name, "schema": schema}})
            return name, schema, reply.choices[0]

        jobs = [pool.submit(run_schema, i, name, schema) for i, (name, schema) in
                enumerate(SCHEMAS)]
        for job in jobs:
            name, schema, choice = job.result()
            text = choice.message.content
            checks.expect(choice.finish_reason == "stop",
                          f"schema {name}: finish_reason {choice.finish_reason}: {text!r}")
            try:
                jsonschema.validate(json.loads(text), schema)
                checks.passed += 1
            except (ValueError, jsonschema.ValidationError) as error:
                checks.expect(False, f"schema {name}: {text!r}: {error}")
        print(f"{len(SCHEMAS)} schemas sampled", flush=True)

        # ---- Regular expressions and grammars.
        def run_constraint(index, key, value):
            reply = chat(client, served, 2000 + index, "Write something short.",
                         extra_body={key: value})
            return reply.choices[0]

        jobs = [(pattern, pool.submit(run_constraint, i, "guided_regex", pattern))
                for i, pattern in enumerate(REGEXES)]
        jobs += [(check, pool.submit(run_constraint, 100 + i, "guided_grammar", grammar))
                 for i, (grammar, check) in enumerate(GRAMMARS)]
        for pattern, job in jobs:
            choice = job.result()
            text = choice.message.content
            checks.expect(choice.finish_reason == "stop" and re.fullmatch(pattern, text),
                          f"pattern {pattern!r}: {choice.finish_reason} {text!r}")

        # ---- response_format json_schema: 100 of 100 valid.
        schema = SCHEMAS[[n for n, _ in SCHEMAS].index("openai_strict_style")][1]
        tries = [pool.submit(chat, client, served, 5000 + k, "Describe a book as JSON.",
                             response_format={"type": "json_schema", "json_schema": {
                                 "name": "book", "strict": True, "schema": schema}})
                 for k in range(100)]
        valid = 0
        for job in tries:
            choice = job.result().choices[0]
            try:
                jsonschema.validate(json.loads(choice.message.content), schema)
                valid += choice.finish_reason == "stop"
            except (ValueError, jsonschema.ValidationError) as error:
                print("invalid:", choice.message.content, error)
        print(f"response_format json_schema: {valid} of 100 valid", flush=True)
        checks.expect(valid == 100, f"response_format json_schema: {valid} of 100 valid")
        reply = client.chat.completions.create(
            model=served, temperature=0, max_tokens=512, response_format={"type": "json_object"},
            messages=[{"role": "user", "content": "Return a JSON object with a name and an age."}])
        choice = reply.choices[0]
        try:
            checks.expect(choice.finish_reason == "stop" and
                          isinstance(json.loads(choice.message.content), dict),
                          f"json_object: {choice.finish_reason} {choice.message.content!r}")
        except ValueError as error:
            checks.expect(False, f"json_object: {choice.message.content!r}: {error}")

        # ---- Tool calls, forced: by name and "required".
        def run_tool(seed, choice):
            return client.chat.completions.create(
                model=served, temperature=1.0, max_tokens=512, seed=seed, tools=TOOLS,
                tool_choice=choice, messages=[
                    {"role": "user", "content": "What is the weather in Paris? And 2 + 3?"}])

        forced = [({"type": "function", "function": {"name": "add"}}, "add"),
                  ({"type": "function", "function": {"name": "get_weather"}}, "get_weather"),
                  ("required", None), ("required", None)]
        jobs = [(name, pool.submit(run_tool, 300 + i, choice))
                for i, (choice, name) in enumerate(forced)]
        for name, job in jobs:
            choice = job.result().choices[0]
            calls = choice.message.tool_calls or []
            checks.expect(choice.finish_reason == "tool_calls" and len(calls) >= 1,
                          f"forced tool call {name}: {choice.finish_reason} {choice.message}")
            for call in calls:
                tool = next((t for t in TOOLS if t["function"]["name"] == call.function.name),
                            None)
                checks.expect(tool is not None and (name is None or call.function.name == name),
                              f"tool call names {call.function.name}, wanted {name}")
                if tool is None:
                    continue
                try:
                    jsonschema.validate(json.loads(call.function.arguments),
                                        tool["function"]["parameters"])
                    checks.passed += 1
                except (ValueError, jsonschema.ValidationError) as error:
                    checks.expect(False, f"tool call {call.function.arguments!r}: {error}")
                checks.expect(call.id.startswith("call_") and call.type == "function",
                              f"tool call id/type: {call.id} {call.type}")

        # Streamed: the call arrives whole in the choice's last delta.
        stream = client.chat.completions.create(
            model=served, temperature=1.0, max_tokens=512, seed=77, tools=TOOLS, stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            messages=[{"role": "user", "content": "Weather in Oslo?"}])
        streamed_calls, streamed_finish = [], None
        for chunk in stream:
            for choice in chunk.choices:
                streamed_calls += choice.delta.tool_calls or []
                streamed_finish = choice.finish_reason or streamed_finish
        checks.expect(streamed_finish == "tool_calls" and len(streamed_calls) == 1 and
                      streamed_calls[0].function.name == "get_weather",
                      f"streamed tool call: {streamed_finish} {streamed_calls}")
        if streamed_calls:
            try:
                jsonschema.validate(json.loads(streamed_calls[0].function.arguments),
                                    TOOLS[0]["function"]["parameters"])
                checks.passed += 1
            except (ValueError, jsonschema.ValidationError) as error:
                checks.expect(False, f"streamed tool call arguments: {error}")

        # A conversation with an assistant tool call and the tool's answer is accepted.
        reply = client.chat.completions.create(
            model=served, temperature=0, max_tokens=16, tools=TOOLS, messages=[
                {"role": "user", "content": "2 + 3?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "5"}])
        checks.expect(reply.choices[0].finish_reason in ("stop", "length", "tool_calls"),
                      f"a tool conversation: {reply.choices[0].finish_reason}")
        reply = run_tool(9, "none")
        checks.expect(not reply.choices[0].message.tool_calls, "tool_choice none calls nothing")

        # ---- Refusals: 400 naming the problem.
        def refused(body, needle):
            try:
                client.chat.completions.create(
                    model=served, max_tokens=4, messages=[{"role": "user", "content": "x"}],
                    **body)
            except openai.BadRequestError as error:
                checks.expect(needle in str(error), f"refusal names {needle!r}: {error}")
                return
            checks.expect(False, f"not refused: {needle}")

        refused({"response_format": {"type": "json_schema", "json_schema": {
            "name": "m", "schema": {"type": "number", "multipleOf": 2}}}}, "'multipleOf'")
        deep = {"type": "string"}
        for _ in range(100):
            deep = {"type": "array", "items": deep}
        refused({"response_format": {"type": "json_schema", "json_schema": {
            "name": "deep", "schema": deep}}}, "nested deeper than")
        refused({"response_format": {"type": "json_schema", "json_schema": {
            "name": "enum", "schema": {"enum": list(range(5000))}}}}, "'enum' has 5000 values")
        refused({"extra_body": {"guided_regex": "((a{1,100}){1,100}){1,100}"}}, "multiply")
        refused({"extra_body": {"guided_regex": "(a)\\1"}}, "backreferences")
        refused({"extra_body": {"guided_grammar": "root ::= root \"a\" | \"b\"\n"}},
                "left recursion")
        pool.shutdown()
    finally:
        server.stop()
    print(f"{checks.passed} checks passed, {len(checks.failures)} failed")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
