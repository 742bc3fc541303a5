#!/usr/bin/env python3
"""`llmq recipe` (issue 27) on the seeded default model and on stories260K (skipped visibly where
the shared test data is absent, and under --sanitized), on few tokens so that it runs in seconds.

Default model: a loose budget (kl<=1, with --report and --stats) and one a quarter of the loose
choice's measured KL. Each recipe must meet its budget as `llmq recipe` measured it and again when
`llmq eval --recipe` quantizes the written recipe.json afresh; every point walked before the choice
missed it; the points named uniform are exactly those with every unit under one scheme, and a
uniform choice is written as that scheme alone; the written checkpoint reloads (llmq recipe's own
reload for each, `llmq eval --quantized` once per model). The tighter budget must walk the same sequence and choose a
point at least as far along, measured no worse (strictly better when another point) and no
cheaper. Refusals: bad budgets and schemes, an MoE model, an output llmq did not write, a budget
only the unquantized model meets (kl and top1 bounds), one nothing meets (a ppl bound). The report
passes check_report_html.py and has its Markdown beside it. stories260K: a loose run, then one run
on perplexity ratio and top-1 agreement together, between the loose choice and the unquantized
model. Limits come from measurements, never from constants.

The default model's runs and the refusals with stories260K run side by side (two cores): the
quantization of each candidate is single-threaded, so one run alone leaves a core idle.

Usage: recipe_search_cli.py LLMQ TESTDATA_DIR [--sanitized]
  --sanitized: under AddressSanitizer (several times slower): no stories260K (the default model
  takes every code path: each metric's bound, uniform and mixed points, every refusal).
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

LLMQ, TESTDATA = sys.argv[1], sys.argv[2]
SANITIZED = "--sanitized" in sys.argv[3:]
# Few tokens: 1 sampled sequence of 8, the same for recipe and eval. The searches that must walk
# every point (the refusals) use one scheme and 4 tokens.
DATA = ["--samples", "1", "--length", "8", "--threads", "2"]
FEW = ["--schemes", "int8-w8a8", "--samples", "1", "--length", "4", "--threads", "2"]
TIMEOUT = 600 if SANITIZED else 300


class Checks:
    """The results of one group of checks, printed together when the group is done."""

    def __init__(self):
        self.lines, self.failures, self.passed = [], 0, 0

    def __call__(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            self.lines.append(f"ok   {name}")
        else:
            self.failures += 1
            self.lines.append(f"FAIL {name} {detail}")


def run_json(args):
    p = subprocess.run([LLMQ] + args, capture_output=True, text=True, timeout=TIMEOUT)
    if p.returncode != 0:
        return None, f"exit {p.returncode}: {p.stderr[-2000:]}"
    try:
        return json.loads(p.stdout), ""
    except json.JSONDecodeError as e:
        return None, f"not JSON ({e}): {p.stdout[:500]}"


def metric(summary, name):
    return {"kl": summary["kl_mean"], "top1": summary["top1"], "ppl": summary["ppl_ratio"]}[name]


def meets(summary, bounds):
    for name, limit in bounds:
        v = metric(summary, name)
        if (v < limit) if name == "top1" else (v > limit):
            return False
    return True


def budget_text(bounds):
    return ",".join(f"{n}>={l!r}" if n == "top1" else f"{n}<={l!r}{'x' if n == 'ppl' else ''}" for n, l in bounds)


def recipe(check, model, work, tag, bounds, extra, reload_with_eval=True):
    out = os.path.join(work, tag)
    j, err = run_json(["recipe", "--model", model, "--budget", budget_text(bounds), "--out", out, "--json"] + DATA + extra)
    check(f"{tag}: recipe {budget_text(bounds)} runs", j is not None, err)
    if j is None:
        return None
    rec = next(c for c in j["candidates"] if c["is_recipe"])
    check(f"{tag}: the recipe meets its budget as searched", meets(rec, bounds), json.dumps(rec))
    chosen = j["points"][j["chosen"]]
    earlier_fail = all(p["evaluated"] and not meets(p["summary"], bounds) for p in j["points"][: j["chosen"]])
    check(f"{tag}: every earlier point walked was evaluated and missed the budget", earlier_fail)
    check(f"{tag}: the chosen point is the recipe", chosen["summary"]["kl_mean"] == rec["kl_mean"])
    # A point is named uniform exactly when every unit is under that one scheme.
    labels = all(p["uniform"] == (f"uniform {j['schemes'][p['assignment'][0]]}"
                                  if p["assignment"][0] >= 0 and len(set(p["assignment"])) == 1 else None)
                 for p in j["points"])
    check(f"{tag}: the points named uniform are those with every unit under one scheme", labels)
    uniform_ok = (rec["name"] == f"recipe ({chosen['uniform']})" and len(j["recipe"]["groups"]) == 1
                  if chosen["uniform"] else rec["name"] == "recipe")
    check(f"{tag}: the recipe row says whether it is uniform; a uniform one is that scheme alone", uniform_ok,
          f"{rec['name']} {chosen['uniform']} {len(j['recipe']['groups'])} groups")
    ckpt = [c for c in j["candidates"] if c["name"] == "recipe checkpoint"]
    check(f"{tag}: llmq recipe reloaded and evaluated the written checkpoint",
          len(ckpt) == 1 and ckpt[0]["kl_mean"] >= 0, json.dumps(ckpt))
    # Afresh: the recipe file quantized again by `llmq eval --recipe`, on the same tokens.
    e, err = run_json(["eval", "--model", model, "--recipe", os.path.join(out, "recipe.json"), "--json"] + DATA)
    check(f"{tag}: llmq eval --recipe runs", e is not None, err)
    if e is not None:
        fresh = e["results"][0]
        check(f"{tag}: llmq eval --recipe meets the budget afresh", meets(fresh, bounds), json.dumps(fresh))
    if reload_with_eval:
        q, err = run_json(["eval", "--model", model, "--quantized", out, "--json"] + DATA)
        check(f"{tag}: llmq eval --quantized reloads and evaluates the written checkpoint", q is not None, err)
    return j


def one_unit_point(j):
    """The last point walked with exactly one unit quantized: its summary is that unit's alone."""
    for p in reversed(j["points"]):
        if sum(1 for o in p["assignment"] if o >= 0) == 1:
            u = next(i for i, o in enumerate(p["assignment"]) if o >= 0)
            return j["units"][u]["alone"][j["schemes"][p["assignment"][u]]]
    return None


def default_model_cases(check, work):
    # The report with statistics from `llmq calibrate` (its outliers) rides on the loose run.
    stats = os.path.join(work, "stats.json")
    p = subprocess.run([LLMQ, "calibrate", "--model", "default", "--samples", "1", "--length", "8", "-o", stats],
                       capture_output=True, text=True, timeout=TIMEOUT)
    check("llmq calibrate for the report", p.returncode == 0, p.stderr[-1000:])
    page = os.path.join(work, "report.html")
    schemes = ["--schemes", "fp8-dynamic,int8-w8a8"]
    loose = recipe(check, "default", work, "loose", [("kl", 1.0)], schemes + ["--report", page, "--stats", stats])
    if loose is None:
        return
    check("loose: --report is named in the JSON", loose["report"] == page)
    checker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_report_html.py")
    p = subprocess.run([sys.executable, checker, page, "--hostile", ""], capture_output=True, text=True)
    check("the report page passes check_report_html.py", p.returncode == 0, p.stdout[-2000:])
    text = open(page, encoding="utf-8").read() if os.path.isfile(page) else ""
    check("the report draws the outliers of every layer", all(f"model.layers.{l}.mlp.down_proj" in text
                                                                for l in range(4)))
    md = os.path.join(work, "report.md")
    check("the Markdown summary is beside it and names the budget",
          os.path.isfile(md) and "budget: kl" in open(md, encoding="utf-8").read())

    rec = next(c for c in loose["candidates"] if c["is_recipe"])
    check("the loose budget quantizes something", loose["chosen"] < len(loose["points"]) - 1 and rec["kl_mean"] > 0,
          json.dumps(rec))
    # Limits no tighter than one unit alone leave a quantized assignment that meets them.
    alone = one_unit_point(loose)
    if alone is None:
        check("the loose search has a point with one unit quantized", False)
        return
    tight = recipe(check, "default", work, "tight", [("kl", max(rec["kl_mean"] / 4, alone["kl_mean"]))], schemes,
                   reload_with_eval=False)
    if tight is None:
        return
    trec = next(c for c in tight["candidates"] if c["is_recipe"])
    same = [p["assignment"] for p in tight["points"]] == [p["assignment"] for p in loose["points"]]
    check("tight: the same sequence walked as the loose budget's", same)
    check("tight: chosen at or after the loose choice", tight["chosen"] >= loose["chosen"])
    if tight["chosen"] == loose["chosen"]:
        check("tight: the same point, measured the same", trec["kl_mean"] == rec["kl_mean"])
    else:
        check("tight: a later point, measured strictly better than the loose choice", trec["kl_mean"] < rec["kl_mean"],
              f"{trec['kl_mean']} >= {rec['kl_mean']}")
    check("tight: no cheaper than the loose choice", trec["bytes"] >= rec["bytes"])


def refused(check, name, args, pattern, code=2):
    p = subprocess.run([LLMQ] + args, capture_output=True, text=True, timeout=TIMEOUT)
    check(f"refused: {name} (exit {p.returncode})", p.returncode == code and pattern in p.stderr, p.stderr[-1000:])


def refusals(check, work):
    never = os.path.join(work, "never")
    base = ["recipe", "--model", "default", "--out", never]
    refused(check, "a lower bound on KL", base + ["--budget", "kl>=0.1"] + DATA, "--budget 'kl>=0.1'")
    refused(check, "an unknown scheme", base + ["--budget", "kl<=0.1", "--schemes", "fp8-dynamic,fp9"], "--schemes")
    refused(check, "a scheme named twice", base + ["--budget", "kl<=0.1", "--schemes", "int8-w8a8,int8-w8a8"],
            "named twice")
    refused(check, "an MoE model, before the search",
            ["recipe", "--model", "default-moe", "--budget", "kl<=1", "--out", never], "an MoE model", code=1)
    os.mkdir(os.path.join(work, "mine"))
    refused(check, "an output llmq did not write",
            ["recipe", "--model", "default", "--budget", "kl<=1", "--out", os.path.join(work, "mine")], "--out")
    # Budgets no quantized assignment meets: searches that walk every point, on one scheme and 4
    # tokens. The kl and top1 bounds meet only all kept; the ppl bound not even that.
    refused(check, "a budget only the unquantized model meets", base + ["--budget", "kl<=0,top1>=1"] + FEW,
            "only the unquantized model meets it")
    refused(check, "a budget nothing meets", base + ["--budget", "ppl<=0.5x"] + FEW, "not even every unit kept")
    check("nothing written by a refused run", not os.path.exists(never))


def stories_cases(check, work, stories):
    loose = recipe(check, stories, work, "stories loose", [("kl", 1.0)], [], reload_with_eval=False)
    if loose is None:
        return
    rec = next(c for c in loose["candidates"] if c["is_recipe"])
    alone = one_unit_point(loose)
    if alone is None:
        check("stories loose: the search has a point with one unit quantized", False)
        return
    # Between the loose choice and the unquantized model, no tighter than one unit alone.
    bounds = [("ppl", max(1 + (rec["ppl_ratio"] - 1) / 2, alone["ppl_ratio"], 1.0)),
              ("top1", min(rec["top1"] + (1 - rec["top1"]) / 2, alone["top1"]))]
    recipe(check, stories, work, "stories ppl,top1", bounds, [])


def group(fn, *args):
    check = Checks()
    with tempfile.TemporaryDirectory(prefix="llmq-recipe-") as work:
        try:
            fn(check, work, *args)
        except Exception as e:  # a crash of the script is a failure of the group, reported
            check(f"{fn.__name__} finished", False, repr(e))
    return fn.__name__, check


def main():
    stories = os.path.normpath(os.path.join(TESTDATA, "..", "models", "stories260K.bin"))
    groups = [(default_model_cases,), (refusals,)]
    if SANITIZED:
        print("skip stories260K: --sanitized")
    elif not os.path.isfile(stories):
        print(f"skip stories260K: test data absent: {stories}")
    else:
        groups.append((stories_cases, stories))
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda g: group(*g), groups))
    passed = failures = 0
    for name, check in results:
        print(f"-- {name}")
        print("\n".join(check.lines))
        passed += check.passed
        failures += check.failures
    print(f"recipe_search_cli: {passed} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
