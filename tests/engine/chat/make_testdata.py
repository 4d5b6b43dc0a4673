#!/usr/bin/env python3
"""Regenerates the expected outputs of the chat-template tests with Python's jinja2.

The C++ tests (chat_template_test.cc, jinja_test.cc) compare lmserve's Jinja interpreter with
these renders, so the reference is jinja2 itself, configured exactly as transformers'
apply_chat_template configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols; tojson, raise_exception and strftime_now as transformers defines them) and called
as transformers calls it (messages, tools=None, documents=None, add_generation_prompt, special
tokens, extra variables).

Usage: python3 tests/engine/chat/make_testdata.py   (needs jinja2; writes testdata/*_expected.json)
"""

import datetime
import json
import os

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.path.join(HERE, "testdata")


class GenerationBlock(jinja2.ext.Extension):
    """transformers' {% generation %}...{% endgeneration %} (AssistantTracker), which renders its
    body unchanged unless assistant-token masks are requested."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(
            lineno)

    def _render(self, caller):
        return caller()


def make_environment(now_epoch_seconds):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.fromtimestamp(now_epoch_seconds).strftime(format)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, variables):
    """{"text": ...} or {"error": message, "raised": bool}."""
    try:
        return {"text": env.from_string(source).render(**variables)}
    except (jinja2.exceptions.TemplateSyntaxError, SyntaxError) as e:
        # jinja2 compiles to Python: "break" outside a loop is Python's SyntaxError.
        return {"error": str(e), "raised": False, "syntax": True}
    except jinja2.exceptions.UndefinedError as e:
        return {"error": str(e), "raised": False}
    except jinja2.exceptions.TemplateError as e:
        # raise_exception() raises the base TemplateError; jinja2's own errors are subclasses.
        return {"error": str(e), "raised": type(e) is jinja2.exceptions.TemplateError}
    except Exception as e:  # TypeError, ZeroDivisionError, OverflowError, ...
        return {"error": f"{type(e).__name__}: {e}", "raised": False}


def chat_expected():
    with open(os.path.join(TESTDATA, "chat_cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    env = make_environment(cases["now_epoch_seconds"])
    expected = {}
    for template_name, template in cases["templates"].items():
        with open(os.path.join(TESTDATA, "templates", template["file"]), encoding="utf-8",
                  newline="") as f:
            source = f.read()
        for conversation_name, conversation in cases["conversations"].items():
            variables = {
                "messages": conversation["messages"],
                "tools": None,
                "documents": None,
                "add_generation_prompt": conversation["add_generation_prompt"],
            }
            if template["bos_token"] is not None:
                variables["bos_token"] = template["bos_token"]
            if template["eos_token"] is not None:
                variables["eos_token"] = template["eos_token"]
            variables.update(conversation.get("extra_variables", {}))
            expected[f"{template_name}/{conversation_name}"] = render(env, source, variables)
    return expected


# Interpreter cases: (name, template, variables). Each renders with messages=[], tools=None,
# documents=None, add_generation_prompt=True and then `variables`.
INTERPRETER_CASES = [
    # Whitespace control, trim_blocks and lstrip_blocks.
    ("text_only", "plain text", {}),
    ("trailing_newline_dropped", "a\n", {}),
    ("two_trailing_newlines", "a\n\n", {}),
    ("crlf_normalized", "a\r\nb{% if true %}\r\nc{% endif %}\r\n", {}),
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nend", {}),
    ("lstrip_blocks", "a\n    {% if true %}\n    x\n    {% endif %}\nb", {}),
    ("lstrip_after_trimmed_block", "{% if true %}\n    {% endif %}|", {}),
    ("lstrip_not_for_variables", "a\n    {{ 1 }}\n    {% if true %}b{% endif %}", {}),
    ("lstrip_needs_line_start", "{{ 1 }}  {% if true %}y{% endif %}", {}),
    ("minus_strips_both_sides", "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}  \n  c", {}),
    ("minus_on_variables", "a \n {{- 'x' -}} \n b", {}),
    ("plus_disables_lstrip_and_trim", "x {%+ if true %}y{% endif +%}\nz", {}),
    ("comments", "A  {#- c #}  B {# c -#}\n  C\n  {# d #}\nD", {}),
    ("comment_with_tags_inside", "{# {{ x }} {% if %} #}ok", {}),
    ("raw_block", "{% raw %}\n{{ a }}{% if %}{% endraw %}\n|", {}),
    ("raw_block_strips", "  {%- raw -%}  {{ a }}  {%- endraw -%}  |", {}),
    ("braces_inside_expression", "{{ {'a': {'b': 1}} }}", {}),
    ("nested_blocks_indented",
     "{%- for m in ms %}\n    {%- if m %}\n        {{- m }}\n    {%- endif %}\n{%- endfor %}\n",
     {"ms": ["a", "", "b"]}),
    # Literals.
    ("string_escapes", r"""{{ 'a\nb\tc\\d\'e"f' }}|{{ "\u00e9\x41\101\q" }}""", {}),
    ("adjacent_strings", "{{ 'a' \"b\" 'c' }}", {}),
    ("numbers", "{{ 1_000 }} {{ 1.5e3 }} {{ 1e3 }} {{ 1.0e-2 }} {{ 0.1 }} {{ 42 }}", {}),
    ("constants", "{{ true }} {{ True }} {{ false }} {{ none }} {{ None }}", {}),
    ("list_and_tuple_repr", "{{ [1, 'a', \"b'\", none, true, 1.5] }} {{ (1, 2) }} {{ (1,) }} {{ () }}",
     {}),
    ("dict_repr", "{{ {'k': 'v', 'n': [1, {'x': none}]} }}", {}),
    ("float_repr", "{{ 1.0 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1/3 }} {{ 2.5e-8 }}"
     " {{ 123456789.123 }} {{ -0.0 }} {{ 1e300 * 10 }}", {}),
    ("string_repr_escapes", "{{ ['it\\'s', 'a\\nb', '\\\\', '\\x01', 'h\u00e9', '\u00a0'] }}", {}),
    # Arithmetic and operators.
    ("arithmetic", "{{ 1 + 2 * 3 }} {{ 10 - 2 - 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }}"
     " {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** 3 ** 2 }} {{ 2 ** -1 }} {{ 7 // 2.0 }}"
     " {{ 7.5 % 2 }} {{ 3 / 1 }}", {}),
    ("unary", "{{ -2 }} {{ +3 }} {{ -(1 + 2) }} {{ -1 ** 2 }} {{ - -1 }}", {}),
    ("bool_arithmetic", "{{ true + true }} {{ true * 3 }}", {}),
    ("string_ops", "{{ 'ab' * 3 }} {{ 3 * 'ab' }} {{ 'a' + 'b' }} {{ [1] * 2 }} {{ [1] + [2] }}"
     " {{ 'x' * 0 }}|{{ 'x' * -1 }}|", {}),
    ("concat_tilde", "{{ 'a' ~ 1 ~ none ~ true ~ 1.5 ~ [1] ~ undefined_name }}", {}),
    ("tilde_binds_tighter_than_plus", "{{ 1 + 2 ~ 3 }}", {}),
    ("comparisons", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 1 > 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }}"
     " {{ 1 != 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ [1, 2] < [1, 3] }} {{ true == 1 }}"
     " {{ 'a' == 'a' }} {{ none == none }}", {}),
    ("in_operator", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }}"
     " {{ 'z' not in 'abc' }} {{ 3 not in [1] }} {{ not 'a' in 'abc' }}", {}),
    ("logic", "{{ true and false }} {{ true or false }} {{ not true }} {{ 0 or 'x' }}"
     " {{ 'a' and 'b' }} {{ none or [] }} {{ 1 and 0 }}", {}),
    ("logic_precedence", "{{ not 1 == 2 }} {{ true or false and false }} {{ (true or false) and false }}",
     {}),
    ("conditional_expression", "{{ 'y' if true else 'n' }} {{ 'y' if false else 'n' }}"
     " {{ 'y' if false }}| {{ 'a' if 0 else 'b' if 1 else 'c' }}", {}),
    ("filter_binds_tighter_than_unary", "{{ -2|abs }} {{ -x|abs }}", {"x": 3}),
    ("filter_on_concat_operand", "{{ 'a' + 'B'|lower }}", {}),
    # Variables, attributes, subscripts.
    ("attribute_and_item", "{{ d.a }} {{ d['a'] }} {{ d.n.m }} {{ l[0] }} {{ l[-1] }} {{ l.0 }}",
     {"d": {"a": 1, "n": {"m": 2}}, "l": [10, 20, 30]}),
    ("dict_method_beats_key_for_dot", "{{ d['items'] }} {{ d.get('a') }} {{ d['get'] }}",
     {"d": {"a": 1, "items": 2, "get": 3}}),
    ("missing_attribute_is_undefined", "{{ d.b }}|{{ d['b'] }}|{{ l[5] }}|{{ d.b is defined }}",
     {"d": {"a": 1}, "l": [1]}),
    ("string_index", "{{ s[0] }} {{ s[-1] }} {{ s[1] }} {{ s[9] }}|", {"s": "h\u00e9llo"}),
    ("slices", "{{ s[1:3] }} {{ s[::-1] }} {{ s[:-1] }} {{ l[1:] }} {{ l[::2] }} {{ l[-2:] }}"
     " {{ l[5:] }} {{ l[:0] }} {{ t[1:] }}", {"s": "h\u00e9llo", "l": [1, 2, 3, 4], "t": [1, 2]}),
    ("slice_of_tuple", "{{ (1, 2, 3)[1:] }}", {}),
    # Undefined.
    ("undefined_renders_empty", "[{{ nope }}]", {}),
    ("undefined_tests", "{{ nope is defined }} {{ nope is undefined }} {{ nope is none }}"
     " {{ nope is iterable }} {{ nope is sequence }} {{ nope is mapping }} {{ nope is string }}", {}),
    ("undefined_is_falsy", "{% if nope %}yes{% else %}no{% endif %} {{ not nope }}", {}),
    ("undefined_equality", "{{ nope == nope }} {{ nope == none }} {{ nope != 1 }} {{ 'a' in nope }}",
     {}),
    ("undefined_filters", "{{ nope|length }}|{{ nope|upper }}|{{ nope|trim }}|{{ nope|first }}|"
     "{{ nope|join(',') }}|{{ nope|list }}|{{ nope|default('x') }}|{{ nope|string }}|"
     "{{ nope|items|list }}", {}),
    ("undefined_iterates_empty", "{% for x in nope %}x{% else %}empty{% endfor %}", {}),
    ("undefined_attribute_error", "{{ nope.x }}", {}),
    ("undefined_item_error", "{{ nope['x'] }}", {}),
    ("undefined_arithmetic_error", "{{ nope + 'a' }}", {}),
    ("undefined_compare_error", "{{ nope < 1 }}", {}),
    ("undefined_call_error", "{{ nope() }}", {}),
    ("missing_attribute_of_missing_error", "{{ d.b.c }}", {"d": {"a": 1}}),
    ("missing_list_element_error", "{{ l[3].role }}", {"l": [{"role": "user"}]}),
    ("none_attribute_is_undefined", "[{{ n.x }}]", {"n": None}),
    # Errors Python raises.
    ("type_error_concat", "{{ 'x' + 1 }}", {}),
    ("type_error_int_plus_str", "{{ 1 + 'x' }}", {}),
    ("division_by_zero", "{{ 1 / 0 }}", {}),
    ("not_iterable", "{% for x in 5 %}{% endfor %}", {}),
    ("none_not_iterable", "{% for x in n %}{% endfor %}", {"n": None}),
    ("range_too_big", "{{ range(200000)|length }}", {}),
    ("tojson_undefined", "{{ nope|tojson }}", {}),
    ("raise_exception", "a{{ raise_exception('Custom message: ' ~ 42) }}b", {}),
    ("raise_exception_in_loop", "{% for m in ms %}{% if m == 2 %}{{ raise_exception('bad ' ~ m) }}"
     "{% endif %}{% endfor %}", {"ms": [1, 2, 3]}),
    ("unpack_mismatch", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("compare_mismatch", "{{ 1 < 'a' }}", {}),
    ("not_callable", "{{ 'x'() }}", {}),
    # Statements.
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two"
     "{% else %}other{% endif %},{% endfor %}", {}),
    ("for_loop_variables", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
     "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ x }};{% endfor %}", {}),
    ("for_loop_prev_next", "{% for x in [1, 2, 3] %}({{ loop.previtem }},{{ loop.nextitem }})"
     "{% endfor %}", {}),
    ("for_loop_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}", {}),
    ("for_tuple_unpacking", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}"
     "{% for (a, b) in [[1, 2], [3, 4]] %}{{ a + b }};{% endfor %}", {"d": {"x": 1, "y": 2}}),
    ("for_over_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("for_filter", "{% for x in range(10) if x is odd %}{{ x }}{{ loop.index }}{{ loop.last }};"
     "{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}"
     "{% for x in [1] if x > 5 %}x{% else %}filtered{% endfor %}", {}),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}"
     "{% endfor %}|{{ loop.index }};{% endfor %}", {}),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
     "{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("set_scoping_in_loop", "{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }}"
     "{% endfor %}{{ x }}", {}),
    ("set_in_if_leaks", "{% if true %}{% set z = 3 %}{% endif %}{{ z }}", {}),
    ("set_in_loop_is_per_iteration", "{% for i in range(3) %}{% if i == 0 %}{% set y = 5 %}{% endif %}"
     "{{ y }},{% endfor %}", {}),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}", {}),
    ("set_block", "{% set x %}hello {{ 'world' }}{% endset %}[{{ x }}]"
     "{% set y | upper %}shout{% endset %}{{ y }}", {}),
    ("namespace", "{% set ns = namespace(found=false, count=0) %}{% for x in [1, 2, 3] %}"
     "{% if x == 2 %}{% set ns.found = true %}{% endif %}{% set ns.count = ns.count + x %}"
     "{% endfor %}{{ ns.found }} {{ ns.count }} {{ ns.missing is defined }}", {}),
    ("namespace_list_append", "{% set ns = namespace(items=[]) %}{% for x in 'ab' %}"
     "{% set ns.items = ns.items + [x] %}{% endfor %}{{ ns.items }}", {}),
    ("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}", {}),
    ("reassign_messages", "{% set messages = messages[1:] %}{{ messages|length }}",
     {"messages": [{"role": "system"}, {"role": "user"}]}),
    ("macro", "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}"
     "{{ greet('Bob') }} {{ greet('Al', greeting='Hi') }} {{ greet(name='Cy') }}", {}),
    ("macro_sees_globals_at_call_time", "{% set g = 1 %}{% macro m() %}{{ g }}{% endmacro %}"
     "{% set g = 2 %}{{ m() }}", {}),
    ("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}"
     "{% endif %}{% endmacro %}{{ fact(10) }}", {}),
    ("macro_missing_argument", "{% macro m(a, b) %}[{{ a }}|{{ b }}|{{ b is defined }}]{% endmacro %}"
     "{{ m(1) }}", {}),
    ("macro_json_schema_types",
     "{%- macro render_type(spec) -%}{%- if spec.type == 'array' -%}list[{{ render_type(spec['items']) }}]"
     "{%- elif spec.type == 'object' -%}dict{%- else -%}{{ spec.type }}{%- endif -%}{%- endmacro -%}"
     "{{ render_type({'type': 'array', 'items': {'type': 'array', 'items': {'type': 'string'}}}) }}",
     {}),
    ("call_block", "{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inner{% endcall %}",
     {}),
    ("call_block_with_args", "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}"
     "{% endmacro %}{% call(item) each([1, 2]) %}[{{ item }}]{% endcall %}", {}),
    ("filter_block", "{% filter upper %}hello {{ 'x' }}{% endfilter %}", {}),
    ("generation_block_passthrough", "a{% generation %}b{% endgeneration %}c", {}),
    # Filters.
    ("filter_trim_and_case", "[{{ '  a b  '|trim }}] {{ 'aBc'|upper }} {{ 'aBc'|lower }}"
     " {{ 'hello-world foo_bar'|title }} {{ 'aBC dEF'|capitalize }} [{{ 'xxaxx'|trim('x') }}]", {}),
    ("filter_trim_unicode_whitespace", "[{{ '\u3000\u00a0 a\u2003\n'|trim }}]", {}),
    ("filter_length", "{{ 'h\u00e9llo'|length }} {{ [1, 2]|length }} {{ {'a': 1}|count }}"
     " {{ ''|length }}", {}),
    ("filter_default", "{{ nope|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }}"
     " {{ none|d('d') }} {{ 0|default(5, boolean=true) }}", {}),
    ("filter_join", "{{ [1, 2, 3]|join(', ') }} {{ ['a', 'b']|join }} {{ 'abc'|join('-') }}"
     " {{ [{'n': 'x'}, {'n': 'y'}]|join('+', attribute='n') }}", {}),
    ("filter_first_last", "{{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|first }}"
     " {{ 'abc'|last }} [{{ []|first }}]", {}),
    ("filter_replace", "{{ 'aXbXc'|replace('X', '-') }} {{ 'aXbXc'|replace('X', '-', 1) }}"
     " {{ 'ab'|replace('', '.') }}", {}),
    ("filter_tojson", "{{ d|tojson }}", {"d": {"b": 1, "a": [1, 2.5, None, True, "\u00e9\n\"\\"],
                                              "c": {}, "e": []}}),
    ("filter_tojson_indent", "{{ d|tojson(indent=2) }}|{{ d|tojson(indent='\t') }}",
     {"d": {"b": 1, "a": [1, {"x": []}], "c": {}}}),
    ("filter_tojson_options", "{{ d|tojson(sort_keys=true) }} {{ d|tojson(separators=(',', ':')) }}"
     " {{ 'h\u00e9 \U0001F600'|tojson(ensure_ascii=true) }} {{ d|tojson(indent=0) }}",
     {"d": {"b": 1, "a": [1, 2]}}),
    ("filter_tojson_control_chars", "{{ s|tojson }}", {"s": "\x00\x01\x1f\x7f\b\f\r\t</script>"}),
    ("filter_tojson_floats", "{{ [1.0, 0.1, 1e20, 1e-7, 123.456, 2.5e16]|tojson }}", {}),
    ("filter_string_int_float", "{{ 5|string|length }} {{ '42'|int + 1 }} {{ ' 42 '|int }}"
     " {{ '3.9'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.7|int }} {{ true|int }} {{ '1e3'|float }}"
     " {{ 'x'|float }} {{ 2|float }} {{ '1_000'|int }}", {}),
    ("filter_round_abs", "{{ 1.5|round }} {{ 2.5|round }} {{ 2.675|round(2) }} {{ 3|round }}"
     " {{ 1.24|round(1, 'ceil') }} {{ 1.26|round(1, 'floor') }} {{ -3|abs }} {{ -2.5|abs }}", {}),
    ("filter_list_items", "{{ 'ab'|list }} {{ {'k': 1, 'j': 2}|list }} {{ {'k': 1}|items|list }}"
     " {{ (1, 2)|list }}", {}),
    ("filter_unique_reverse_sort", "{{ ['b', 'A', 'a', 'b']|unique|list }}"
     " {{ ['b', 'A', 'a']|unique(case_sensitive=true)|list }} {{ [1, 2, 3]|reverse|list }}"
     " {{ 'abc'|reverse }} {{ [3, 1, 2]|sort }} {{ ['b', 'A', 'a']|sort }}"
     " {{ ['b', 'A', 'a']|sort(case_sensitive=true) }} {{ [1, 3, 2]|sort(reverse=true) }}"
     " {{ [{'n': 2}, {'n': 1}]|sort(attribute='n') }}", {}),
    ("filter_dictsort", "{{ {'b': 1, 'a': 2}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }}",
     {}),
    ("filter_map_select", "{{ ms|map(attribute='role')|list }} {{ ['a', 'B']|map('upper')|join }}"
     " {{ ms|selectattr('role', 'equalto', 'user')|list|length }}"
     " {{ ms|rejectattr('role', 'equalto', 'user')|map(attribute='role')|list }}"
     " {{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3]|reject('odd')|list }}"
     " {{ [0, 1, '', 'a']|select|list }} {{ ms|selectattr('tool_calls')|list|length }}"
     " {{ ms|map(attribute='missing', default='d')|list }}"
     " {{ [[1, 2], [3]]|map('length')|list }} {{ ['a', 'b']|map('replace', 'a', 'z')|list }}",
     {"ms": [{"role": "user"}, {"role": "assistant", "tool_calls": [1]}, {"role": "user"}]}),
    ("filter_select_map_on_none", "{{ n|selectattr('a')|list }} {{ n|map('upper')|list }}"
     " {{ n|reject|list }} {{ ''|select|list }}", {"n": None}),
    ("filter_join_on_none_error", "{{ n|join }}", {"n": None}),
    ("filter_selectattr_dotted", "{{ ms|selectattr('function.name', 'in', ['a', 'c'])|list|length }}",
     {"ms": [{"function": {"name": "a"}}, {"function": {"name": "b"}}, {"function": {"name": "c"}}]}),
    ("filter_sum_min_max", "{{ [1, 2, 3]|sum }} {{ [1.5, 2]|sum }} {{ [{'v': 2}, {'v': 3}]|sum('v') }}"
     " {{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ ['b', 'A', 'c']|min }} {{ ['b', 'A', 'c']|max }}",
     {}),
    ("filter_indent", "[{{ 'a\nb\n\nc'|indent(2) }}] [{{ 'a\nb'|indent(2, true) }}]"
     " [{{ 'a\n\nb'|indent(2, blank=true) }}] [{{ 'a\nb'|indent('> ') }}]", {}),
    ("filter_escape_safe", "{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|safe }} {{ '<i>'|escape }}", {}),
    ("filter_wordcount", "{{ 'hello big world'|wordcount }}", {}),
    ("filter_attr", "{{ d|attr('a') }}", {"d": {"a": 1}}),
    # Tests.
    ("tests_types", "{{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ 'a' is number }}"
     " {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ 'a' is string }}"
     " {{ {} is mapping }} {{ [] is mapping }} {{ [] is iterable }} {{ 'a' is iterable }}"
     " {{ 5 is iterable }} {{ [] is sequence }} {{ {} is sequence }} {{ none is none }}"
     " {{ true is boolean }} {{ 1 is boolean }} {{ true is true }} {{ 1 is true }}"
     " {{ false is false }} {{ range is callable }} {{ 'a' is callable }}", {}),
    ("tests_numbers", "{{ 2 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }}"
     " {{ 9 is divisibleby(4) }} {{ 4.0 is even }}", {}),
    ("tests_comparisons", "{{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ 1 is ne 2 }} {{ 1 is lt 2 }}"
     " {{ 2 is gt 1 }} {{ 2 is ge 2 }} {{ 2 is le 1 }} {{ 'a' is in 'abc' }} {{ 1 is in [2] }}"
     " {{ none is sameas none }}", {}),
    ("tests_strings", "{{ 'abc' is lower }} {{ 'aBc' is lower }} {{ 'ABC' is upper }} {{ '1' is lower }}",
     {}),
    ("test_negation", "{{ 1 is not none }} {{ none is not none }} {{ nope is not defined }}"
     " {{ not nope is defined }}", {}),
    ("test_in_filter_chain", "{{ 'x' if tools is not none else 'none' }} {{ tools is defined }}", {}),
    # str methods.
    ("str_strip", "[{{ '  a  '.strip() }}] [{{ '  a  '.lstrip() }}] [{{ '  a  '.rstrip() }}]"
     " [{{ 'xxaxx'.strip('x') }}] [{{ '\n\ta\n'.strip() }}]", {}),
    ("str_split", "{{ ' a  b '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a b c'.split(' ', 1) }}"
     " {{ 'a b c'.split(none, 1) }} {{ ''.split() }} {{ ''.split(',') }} {{ 'a\nb\r\nc'.splitlines() }}",
     {}),
    ("str_affixes", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }}"
     " {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.endswith('x') }}", {}),
    ("str_case", "{{ 'hello world'.title() }} {{ 'hello-world 1st'.title() }} {{ 'aBc'.upper() }}"
     " {{ 'aBc'.lower() }} {{ 'aBC'.capitalize() }} {{ 'h\u00e9llo'.title() }}", {}),
    ("str_replace_find_count", "{{ 'a.b.c'.replace('.', '/') }} {{ 'a.b.c'.replace('.', '/', 1) }}"
     " {{ 'h\u00e9llo'.find('l') }} {{ 'abc'.find('z') }} {{ 'banana'.count('an') }}", {}),
    ("str_join_format", "{{ ', '.join(['a', 'b']) }} {{ '{} and {}'.format('x', 1) }}"
     " {{ '{0}{0}{name}'.format('r', name='n') }} {{ '{{}}'.format() }}", {}),
    ("str_predicates", "{{ '123'.isdigit() }} {{ '12a'.isdigit() }} {{ 'abc'.isalpha() }}"
     " {{ ' \t'.isspace() }} {{ ''.isspace() }}", {}),
    ("dict_methods", "{{ d.items()|list }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.get('a') }}"
     " {{ d.get('z') }} {{ d.get('z', 0) }}", {"d": {"a": 1, "b": [2]}}),
    # Globals.
    ("range", "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }}"
     " {{ range(0)|list }} {{ range(3)|length }}", {}),
    ("dict_global", "{{ dict(a=1, b='x') }}", {}),
    ("strftime_now", "{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%dT%H:%M') }}", {}),
    ("strftime_is_defined", "{{ strftime_now is defined }} {{ raise_exception is defined }}", {}),
    # What transformers passes in.
    ("transformers_variables", "{{ messages }} {{ tools }} {{ documents }} {{ add_generation_prompt }}"
     " [{{ bos_token }}]", {}),
    ("variables_shadow_globals", "{{ range }}", {"range": "shadowed"}),
    # Syntax errors (the C++ tests check the line numbers).
    ("syntax_unclosed_if", "line1\n{% if true %}\nx", {}),
    ("syntax_unknown_tag", "a\n\n{% frobnicate %}", {}),
    ("syntax_bad_expression", "{{ 1 + }}", {}),
    ("syntax_unclosed_variable", "{{ x ", {}),
    ("syntax_endfor_without_for", "{% endfor %}", {}),
    ("syntax_break_outside_loop", "{% break %}", {}),
]


def interpreter_expected():
    env = make_environment(1725537600)
    expected = []
    for name, source, variables in INTERPRETER_CASES:
        context = {"messages": [], "tools": None, "documents": None, "add_generation_prompt": True}
        context.update(variables)
        result = render(env, source, context)
        expected.append({"name": name, "template": source, "variables": variables, **result})
    return expected


def write(name, data):
    with open(os.path.join(TESTDATA, name), "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    write("chat_expected.json", chat_expected())
    write("interpreter_expected.json", interpreter_expected())


if __name__ == "__main__":
    main()
