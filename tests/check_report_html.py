#!/usr/bin/env python3
"""Strict checks of a quantization report page (issue 27), independent of the C++ that wrote it.

  check_report_html.py PAGE.html [--hostile TEXT]
  check_report_html.py --run TEST_BINARY   # runs its QuantReportExample test into a temporary
                                           # folder, then checks the page it wrote

The page must be: `<!DOCTYPE html>` then one element that Python's XML parser (expat, strict) reads
whole; every <svg> with width, height and a viewBox; no numeric attribute that is not a finite
number; no URL but the SVG namespace (nothing fetched); no <script>, <link>, <img>, <iframe>,
<object> or <embed>; the hostile TEXT nowhere raw, and present escaped. Prints
"check_report_html: ok" and exits 0, or names each problem and exits 1.
"""
import math
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

SVG_NS = "http://www.w3.org/2000/svg"
# The string tests/test_quant_report.cpp puts in the model name, a scheme, a site and a reason.
DEFAULT_HOSTILE = "</svg><script>alert(\"x&y\")</script><!-- '"
NUMERIC = {"x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r", "width", "height", "font-size", "stroke-width"}
FORBIDDEN_TAGS = {"script", "link", "img", "iframe", "object", "embed", "base", "audio", "video", "source"}


def local(tag):
    return tag.split("}", 1)[1] if tag.startswith("{") else tag


def escaped(text):
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&#39;"))


def check(page_bytes, hostile):
    problems = []
    doctype = b"<!DOCTYPE html>\n"
    if not page_bytes.startswith(doctype):
        return ["the page does not start with <!DOCTYPE html>"]
    try:
        root = ET.fromstring(page_bytes[len(doctype):])
    except ET.ParseError as e:
        return [f"not well-formed XML after the doctype: {e}"]
    if local(root.tag) != "html":
        problems.append(f"the root element is <{local(root.tag)}>, not <html>")
    svgs = 0
    for el in root.iter():
        name = local(el.tag)
        if name in FORBIDDEN_TAGS:
            problems.append(f"<{name}> in the page")
        if name == "svg":
            svgs += 1
            if not el.tag.startswith("{" + SVG_NS + "}"):
                problems.append("an <svg> without the SVG namespace")
            for a in ("width", "height", "viewBox"):
                if a not in el.attrib:
                    problems.append(f"an <svg> without {a}")
            box = el.attrib.get("viewBox", "").split()
            if len(box) != 4 or not all(math.isfinite(float(v)) for v in box):
                problems.append(f"viewBox {el.attrib.get('viewBox')!r}")
        for key, value in el.attrib.items():
            key = local(key)
            if key in NUMERIC:
                try:
                    ok = math.isfinite(float(value))
                except ValueError:
                    ok = False
                if not ok:
                    problems.append(f"<{name} {key}={value!r}>: not a finite number")
            if key in ("points", "transform", "viewBox") and re.search(r"nan|inf", value, re.I):
                problems.append(f"<{name} {key}={value!r}>")
            if key in ("href", "src") or key.endswith(":href"):
                problems.append(f"<{name} {key}={value!r}>: a reference")
        if el.text and name in ("td", "th") and re.fullmatch(r"\s*-?(nan|inf)\s*", el.text, re.I):
            problems.append(f"<{name}>{el.text}</{name}>: a value not finite printed as a number")
    if svgs == 0:
        problems.append("no <svg> chart in the page")
    text = page_bytes.decode("utf-8")
    for url in re.findall(r"(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}[^\s\"'<)]*", text):
        if url != SVG_NS:
            problems.append(f"a URL in the page: {url}")
    if "@import" in text or "url(" in text:
        problems.append("the style sheet loads something (@import or url())")
    if hostile:
        if hostile in text:
            problems.append(f"the hostile string {hostile!r} appears unescaped")
        if escaped(hostile) not in text:
            problems.append(f"the hostile string {hostile!r} does not appear escaped")
    return problems


def main():
    args = sys.argv[1:]
    hostile = DEFAULT_HOSTILE
    if "--hostile" in args:
        i = args.index("--hostile")
        hostile = args[i + 1]
        del args[i:i + 2]
    if len(args) == 2 and args[0] == "--run":
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, LLMQ_QUANT_REPORT_OUT=tmp)
            run = subprocess.run([args[1], "--gtest_filter=QuantReportExample.*"], env=env,
                                 capture_output=True, text=True, timeout=120)
            if run.returncode != 0:
                print(run.stdout + run.stderr)
                print("check_report_html: the example test failed")
                return 1
            with open(os.path.join(tmp, "quant_report_example.html"), "rb") as f:
                page = f.read()
    elif len(args) == 1:
        with open(args[0], "rb") as f:
            page = f.read()
    else:
        print(__doc__)
        return 2
    problems = check(page, hostile)
    for p in problems[:50]:
        print("check_report_html:", p)
    if problems:
        print(f"check_report_html: {len(problems)} problem(s)")
        return 1
    print(f"check_report_html: ok ({len(page)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
