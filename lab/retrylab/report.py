"""Reports: the markdown table and the SVG plot of a run."""


def markdown(sc, result):
    modes = [m for m in result["modes"] if not m.get("skipped")]
    exp = result.get("expected_x")
    f = sc.get("fault") or {}
    lines = ["# %s" % sc["name"], "",
             "Ƞ = %s req/s at the root, R = %s retries per hop, fault: %s at %s (rate %s) from %ss to %ss."
             % (sc["rate"], sc["defaults"]["retries"], f.get("kind"), f.get("node"), f.get("rate"),
                f.get("start_s"), f.get("end_s")), "",
             "Requests served per node in the fault window, as multiples of Ƞ:", ""]
    head = "| node | runtime | depth |" + (" model |" if exp else "") + "".join(
        " %s |" % m["mode"] for m in modes)
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for n in sc["nodes"]:
        row = "| %s | %s | %s |" % (n["name"].upper(), n["runtime"], n["depth"])
        if exp:
            row += " %.2fȠ |" % exp.get(n["name"], 0.0)
        for m in modes:
            row += " %.2fȠ |" % m["nodes"][n["name"]]["served_x"]
        lines.append(row)
    lines.append("")
    lines.append("Requests in flight per node (mean over the fault window): " + "; ".join(
        "%s %s" % (m["mode"], ", ".join("%s %.1f" % (n["name"].upper(), m["nodes"][n["name"]].get("in_flight", 0.0))
                                         for n in sc["nodes"])) for m in modes) + ".")
    lines.append("")
    lines.append("| root | " + " | ".join(m["mode"] for m in modes) + " |")
    lines.append("|---|" + "---|" * len(modes))
    lines.append("| availability (whole run) | " + " | ".join(
        fmt_pct(m["root"]["availability"]) for m in modes) + " |")
    lines.append("| availability (fault window) | " + " | ".join(
        fmt_pct(m["root"]["availability_fault_window"]) for m in modes) + " |")
    lines.append("| p99 latency (s) | " + " | ".join(
        str(m["root"]["latency_p99_s"]) for m in modes) + " |")
    lines.append("| fault onset → first suppression (s) | " + " | ".join(
        str(m.get("agent", {}).get("first_suppression_s", "–")) for m in modes) + " |")
    # From the services' records: a retry the callee never saw (answered on the way).
    lines.append("| fault onset → first retry stopped (s) | " + " | ".join(
        str(m.get("agent", {}).get("first_retry_stopped_s", "–")) for m in modes) + " |")
    agent_modes = [m for m in modes if m.get("agent")]
    if agent_modes:
        lines += ["", "Verdicts against ground truth:", "",
                  "| mode | runtime | verdicts | precision | recall | missing |", "|---|---|---|---|---|---|"]
        for m in agent_modes:
            for rt, s in sorted(m["agent"]["per_runtime"].items()):
                lines.append("| %s | %s | %d | %s | %s | %d |" % (
                    m["mode"], rt, s["verdicts"], fmt_pct(s["precision"]), fmt_pct(s["recall"]),
                    s["missing"]))
        lines += ["", "Verdicts that took a side, by how they were linked:", "",
                  "| mode | runtime | link | verdicts | precision |", "|---|---|---|---|---|"]
        for m in agent_modes:
            for rt, links in sorted(m["agent"].get("per_link", {}).items()):
                for lk, c in sorted(links.items()):
                    lines.append("| %s | %s | %s | %d | %s |" % (
                        m["mode"], rt, lk, c["verdicts"], fmt_pct(c["precision"])))
    side_modes = [m for m in modes if m.get("sidecars")]
    if side_modes:
        lines += ["", "Envoy sidecars (the hop's retries are Envoy's; its access log and stats):", "",
                  "| mode | hop | attempts/request (fault window) | upstream_rq_total | "
                  "upstream_rq_retry | upstream_rq_retry_overflow |", "|---|---|---|---|---|---|"]
        for m in side_modes:
            for caller, per in sorted(m["sidecars"].items()):
                for callee, x in sorted(per.items()):
                    lines.append("| %s | %s→envoy→%s | %s | %s | %s | %s |" % (
                        m["mode"], caller.upper(), callee.upper(), x["window_attempts_per_request"],
                        x["upstream_rq_total"], x["upstream_rq_retry"],
                        x["upstream_rq_retry_overflow"]))
    host_modes = [m for m in modes if m.get("per_host")]
    if host_modes:
        lines += ["", "Per host (each its own agent and shim): verdicts by service and claim, "
                  "decisions by edge:", "", "| mode | host | services (verdicts) | decisions |",
                  "|---|---|---|---|"]
        for m in host_modes:
            hosts = {n.get("host"): [] for n in sc["nodes"]}
            for n in sc["nodes"]:
                hosts[n.get("host")].append(n["name"].upper())
            for h, f in sorted(m["per_host"].items()):
                v = "; ".join("%s %s" % (k.upper(), ", ".join("%s %d" % c for c in sorted(cs.items())))
                              for k, cs in f["verdicts"].items()) or "–"
                d = "; ".join("%s %s" % (k, ", ".join("%s ×%d" % c for c in sorted(cs.items())))
                              for k, cs in f["decisions"].items()) or "–"
                lines.append("| %s | %s (%s) | %s | %s |" % (m["mode"], h, ",".join(hosts.get(h, [])), v, d))
    skipped = [m for m in result["modes"] if m.get("skipped")]
    if skipped:
        lines += [""] + ["Mode %s skipped: %s" % (m["mode"], m["skipped"]) for m in skipped]
    return "\n".join(lines) + "\n"


def fmt_pct(x):
    return "–" if x is None else "%.2f%%" % (100 * x)


COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf"]


def svg(sc, result):
    modes = [m for m in result["modes"] if not m.get("skipped")]
    W, H, L, T, B = 900, 260, 60, 30, 30
    total_h = H * max(1, len(modes)) + 40
    ymax = max([max(v) for m in modes for v in m["timeline"].values() if v] + [1])
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="11">' % (W, total_h), '<rect width="100%" height="100%" fill="white"/>']
    for i, m in enumerate(modes):
        oy = 20 + i * H
        pw, ph = W - L - 140, H - T - B
        n_s = max(len(v) for v in m["timeline"].values())

        def X(t):
            return L + pw * t / max(1, n_s)

        def Y(v):
            return oy + T + ph - ph * v / ymax

        out.append('<text x="%d" y="%d" font-size="13">%s — mode: %s (requests/s per node)</text>'
                   % (L, oy + 15, sc["name"], m["mode"]))
        if m.get("fault_start") is not None:
            out.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#fdd" />' % (
                X(m["fault_start"]), oy + T, X(m["fault_end"]) - X(m["fault_start"]), ph))
        d = m.get("agent", {}).get("first_suppression_at")
        if d is not None:
            out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="black" '
                       'stroke-dasharray="4,3"/><text x="%.1f" y="%d">first suppression</text>'
                       % (X(d), X(d), oy + T, oy + T + ph, X(d) + 3, oy + T + 10))
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="black"/>' % (L, L, oy + T, oy + T + ph))
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="black"/>' % (
            L, L + pw, oy + T + ph, oy + T + ph))
        for k in range(5):
            v = ymax * k / 4
            out.append('<text x="%d" y="%.1f" text-anchor="end">%.0f</text>' % (L - 4, Y(v) + 4, v))
        for s in range(0, n_s, max(1, n_s // 10)):
            out.append('<text x="%.1f" y="%d" text-anchor="middle">%ds</text>' % (
                X(s), oy + T + ph + 14, s))
        for j, n in enumerate(sc["nodes"]):
            v = m["timeline"].get(n["name"], [])
            pts = " ".join("%.1f,%.1f" % (X(s + 0.5), Y(c)) for s, c in enumerate(v))
            col = COLORS[j % len(COLORS)]
            out.append('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>' % (col, pts))
            out.append('<text x="%d" y="%d" fill="%s">%s (%s, d=%s)</text>' % (
                L + pw + 10, oy + T + 14 * j + 10, col, n["name"].upper(), n["runtime"], n["depth"]))
    out.append("</svg>")
    return "\n".join(out) + "\n"
