#!/usr/bin/env python3
"""The chat-template oracle (issue 26): Python's jinja2, set up as transformers' apply_chat_template
sets it up, renders every kept template (tests/data/chat_templates/*.jinja) x every conversation
(conversations/*.json) x add_generation_prompt true/false on a fixed date; `llmq template` must print
the same bytes, or fail where jinja2 fails (with the same message for raise_exception).

  chat_template_oracle.py LLMQ_BINARY DATA_DIR

Exit 0: all identical; 1: a difference (each printed with the first differing byte); 77: no jinja2.
"""
import datetime
import json
import os
import subprocess
import sys

DATE = datetime.datetime(2025, 3, 14)  # a Friday, so %a/%A/%b all print something distinctive

try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIPPED: python3-jinja2 is not installed (scripts/install-deps installs it)")
    sys.exit(77)


class RaisedByTemplate(Exception):
    pass


def make_env():
    # transformers' _compile_jinja_template (utils/chat_template_utils.py), with the date fixed.
    def raise_exception(message):
        raise RaisedByTemplate(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return DATE.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_python(env, source, messages, add_generation_prompt, bos, eos):
    try:
        text = env.from_string(source).render(messages=messages, tools=None, documents=None,
                                              add_generation_prompt=add_generation_prompt,
                                              bos_token=bos, eos_token=eos)
        return "ok", text
    except RaisedByTemplate as e:
        return "raised", str(e)
    except jinja2.TemplateError as e:
        return "error", f"{type(e).__name__}: {e}"
    except (TypeError, ValueError, AttributeError, IndexError, KeyError) as e:
        return "error", f"{type(e).__name__}: {e}"


def render_llmq(binary, template, conversation, add_generation_prompt, bos, eos):
    cmd = [binary, "template", "--template", template, "--messages", conversation, "--date", DATE.strftime("%Y-%m-%d"),
           "--bos", bos, "--eos", eos]
    if not add_generation_prompt:
        cmd.append("--no-generation-prompt")
    p = subprocess.run(cmd, capture_output=True, timeout=60)
    return p.returncode, p.stdout.decode("utf-8", "surrogateescape"), p.stderr.decode("utf-8", "replace")


def first_difference(a, b):
    n = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    return f"first difference at character {n}: jinja2 {a[n:n + 40]!r} vs llmq {b[n:n + 40]!r}"


def main():
    binary, data = sys.argv[1], sys.argv[2]
    with open(os.path.join(data, "tokens.json"), encoding="utf-8") as f:
        tokens = json.load(f)
    conv_dir = os.path.join(data, "conversations")
    conversations = sorted(c for c in os.listdir(conv_dir) if c.endswith(".json"))
    env = make_env()
    failures, per_template = [], {}
    for name in sorted(tokens):
        path = os.path.join(data, name)
        with open(path, encoding="utf-8") as f:
            source = f.read()
        bos, eos = tokens[name]["bos"], tokens[name]["eos"]
        counts = per_template.setdefault(name, [0, 0, 0])  # identical texts, identical refusals, cases
        for conv in conversations:
            conv_path = os.path.join(conv_dir, conv)
            with open(conv_path, encoding="utf-8") as f:
                messages = json.load(f)
            for agp in (True, False):
                counts[2] += 1
                case = f"{name} x {conv} add_generation_prompt={agp}"
                kind, want = render_python(env, source, messages, agp, bos, eos)
                rc, got, err = render_llmq(binary, path, conv_path, agp, bos, eos)
                if kind == "ok":
                    if rc != 0:
                        failures.append(f"{case}: jinja2 rendered, llmq failed: {err.strip()}")
                    elif got != want:
                        failures.append(f"{case}: {first_difference(want, got)}")
                    else:
                        counts[0] += 1
                elif rc == 0:
                    failures.append(f"{case}: jinja2 failed ({want}), llmq rendered")
                elif kind == "raised" and f"raise_exception: {want}" not in err:
                    failures.append(f"{case}: jinja2 raised {want!r}, llmq said {err.strip()!r}")
                else:
                    counts[1] += 1
    for name, (same, refused, cases) in per_template.items():
        print(f"{name}: {same} identical, {refused} refused by both, of {cases}")
    for f in failures:
        print("MISMATCH " + f)
    print(f"chat_template_oracle: jinja2 {jinja2.__version__}, {len(per_template)} templates x {len(conversations)} "
          f"conversations x 2: {len(failures)} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
