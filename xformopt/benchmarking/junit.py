"""JUnit XML for the bench checks, so CI systems show each gate check as a test.

One ``<testsuite name="xformopt.bench">`` with one ``<testcase>`` per check
(``latency_median_ms`` and the headline metric). A regression is a ``<failure>`` whose message
is the check's one-line message and whose text is the evidence; a check that could not run
(e.g. metric missing) is ``<skipped>``. Without ``--baseline`` the checks are informative: each
testcase is ``<skipped>`` with its message, so an informative run never turns a build red.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from xformopt.benchmarking.gate import REGRESSION, SKIPPED


def junit_xml(comparison: dict, *, artifact: str = "", properties: dict | None = None, seconds: float = 0.0) -> str:
    checks = comparison.get("checks") or []
    gated = bool(comparison.get("gated"))
    failures = sum(1 for c in checks if gated and c["verdict"] == REGRESSION)
    skipped = sum(1 for c in checks if not gated or c["verdict"] == SKIPPED)
    suite = ET.Element("testsuite", {
        "name": "xformopt.bench",
        "tests": str(len(checks)),
        "failures": str(failures),
        "errors": "0",
        "skipped": str(skipped),
        "time": f"{seconds:.3f}",
    })
    props = {"artifact": artifact, "baseline": comparison.get("baseline") or "", "gated": str(gated).lower(),
             **(properties or {})}
    props_el = ET.SubElement(suite, "properties")
    for name, value in props.items():
        ET.SubElement(props_el, "property", {"name": str(name), "value": str(value)})
    classname = f"xformopt.bench.{artifact}" if artifact else "xformopt.bench"
    for check in checks:
        case = ET.SubElement(suite, "testcase", {"classname": classname, "name": check["name"], "time": "0"})
        evidence = json.dumps({k: check.get(k) for k in ("baseline", "current", "change", "limit", "tolerance",
                                                          "threshold", "evidence")}, indent=2, default=str)
        if not gated:
            ET.SubElement(case, "skipped", {"message": f"informative (no --baseline): {check['message']}"})
        elif check["verdict"] == REGRESSION:
            failure = ET.SubElement(case, "failure", {"message": check["message"], "type": "regression"})
            failure.text = evidence
        elif check["verdict"] == SKIPPED:
            ET.SubElement(case, "skipped", {"message": check["message"]})
        out = ET.SubElement(case, "system-out")
        out.text = check["message"] + "\n" + evidence
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
