import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="tpu-workbench: port your model")

with app.setup:
    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench.exercises import port_your_model as exercise
    from tpu_workbench.porting.findings import STATUSES, brief, context
    from tpu_workbench.porting.verdict import trials_brief

    SMOKE = wb.smoke_mode()
    # Example models with planted blockers (None outside a checkout of the workbench), then
    # the workbench's own clean ones.
    EXAMPLES = {
        _label: _ref for _label, _ref in {
            "a text classifier, written for a GPU (tests/models/port/shapes.py)":
                nb.example_model("port/shapes"),
            "a scorer that stops Dynamo (tests/models/port/masks.py)":
                nb.example_model("port/masks"),
            "a loss that reads its output back (tests/models/port/reads_moved.py)":
                nb.example_model("port/reads_moved"),
            "minGPT, tiny (clean)": "mingpt",
            "Llama from its Transformers config, tiny (clean)": "hf:llama",
        }.items() if _ref
    }
    SECTIONS = nb.Sections()


@app.cell(hide_code=True)
def _():
    mo.md(r"""
    # Port your model to a TPU

    Code written for a GPU usually runs on a TPU, slowly, for reasons that are each a known,
    mechanical porting step: a read of a tensor's value in the middle of the step (`.item()`,
    `.tolist()`, `.cpu()`, `print(t)`, `if t > 0:`), a new sequence length every batch (a new
    XLA compilation each time), a boolean-mask index whose shape depends on the data, a
    tensor made on the CPU inside `forward`, an op XLA does not lower, float64. `port` runs a
    few training steps of your model in torch_xla's lazy mode and under `torch.compile` on
    XLA:CPU (the same HLO a TPU compiles) and names **each blocker at its own line**: host
    reads from torch_xla's own execution analysis (every graph execution's cause and the
    Python line that triggered it) and its transfer counters, each with what it costs per
    step.

    Then it **tries each fix on a patched copy of your file**, on your own batches, one at a
    time (a fix that helped is kept for the next), and measures before and after: steady
    compilations, executions and transfers per step, step time, loss. A fix is *verified*
    only when the number it targets moved the right way and the step got no slower; one that
    did not help, hurt or failed stays in the table, with its numbers and what to try
    instead. Your file is never changed.

    Pick an example, or name your own file, and press **run port**.
    """)
    return


@app.cell
def _():
    example = mo.ui.dropdown(list(EXAMPLES) or ["minGPT, tiny (clean)"],
                             value=(list(EXAMPLES) or ["minGPT, tiny (clean)"])[0],
                             label="model")
    own_file = mo.ui.text(label="or your own", placeholder="path/to/file.py:make",
                          full_width=True)
    steps = mo.ui.slider(3, 12, value=3 if SMOKE else 6, label="steps per pass",
                         show_value=True)
    run_port = mo.ui.run_button(label="run port")
    mo.vstack([mo.hstack([example, steps, run_port], justify="start", gap=2), own_file,
               mo.md("_Your own model: `file.py:make` (relative to where you started marimo), "
                     "where `make()` returns a factory with `build()`, `make_batch(batch_size, "
                     "generator)` and `loss(model, batch)` (see `tpu_workbench/models/user.py`)."
                     "_")])
    return example, own_file, run_port, steps


@app.cell
def _(example, own_file, run_port, steps):
    _ref = (own_file.value or "").strip() or EXAMPLES.get(example.value, "mingpt")
    _preset = "tiny" if _ref in ("mingpt", "hf:llama") else "default"
    report = None
    if SECTIONS.reuse("port", run_port.value,
                      waiting="Press **run port** above to check this model.") is not None:
        try:
            with mo.status.spinner(title=f"port {_ref}") as _spin:
                report = wb.port(_ref, _preset, steps=steps.value,
                                 on_progress=lambda _m: _spin.update(subtitle=_m))
        except wb.WorkbenchError as _exc:
            mo.output.replace(nb.failed_run_callout(f"port {_ref}", _exc))
    return (report,)


@app.cell
def _(report):
    findings_table = None
    if report is not None and report.clean:
        mo.output.replace(mo.callout(mo.md(
            f"**No TPU blockers found in {report.label}.** Checked:\n\n"
            + "\n".join(f"- {_c}" for _c in report.checked)), kind="success"))
    elif report is not None:
        findings_table = nb.table(
            brief(report.findings), selection="single", initial_selection=[0],
            label=f"{len(report.findings)} blockers in {report.label}, costliest first: "
            "the verified fixes by the step time they saved (cost_s, measured on a patched "
            "copy; empty where no fix was tried), then the rest by status. Click a row for "
            "its line, evidence, fix and what the fix did.")
        mo.output.replace(findings_table)
    return (findings_table,)


@app.cell
def _(findings_table, report):
    _chosen = (findings_table.value if findings_table is not None else None)
    if report is not None and _chosen is not None and len(_chosen):
        _pick = _chosen.iloc[0]
        _row = report.findings[(report.findings["kind"] == _pick["kind"])
                               & (report.findings["where"] == _pick["where"])].iloc[0]
        _variants = report.variants_of(_row["kind"], _row["where"])
        mo.output.replace(mo.vstack([
            mo.md(f"### {_row['kind']} at `{_row['where']}`: {_row['status']}\n\n"
                  f"_{wb.PORT_KINDS[_row['kind']]}._\n\n"
                  + context(_row["file"], int(_row["line"]))
                  + f"\n\n**Evidence** (counted in the run): {_row['evidence']}\n\n"
                  "**Fix:**"),
            nb.code_block(str(_row["fix"])),
            mo.md((f"**Measured:** {_row['verified']}\n\n"
                   if _row["verified"] else "")
                  + f"**{_row['status']}**: {STATUSES[_row['status']]}."
                  + (f"\n\n**Instead:** {_row['instead']}" if _row["instead"] else "")),
            wb.charts.port_steps(report.steps, _variants),
        ]))
    return


@app.cell
def _(report):
    if report is not None and report.trials is not None and len(report.trials):
        mo.output.replace(mo.vstack([
            mo.md(f"**Every fix tried on a patched copy of {report.label}**, in the order "
                  "tried, each against the copy before it (measured here, on XLA:CPU; "
                  "compilations: programs first run after the first step):"),
            nb.table(trials_brief(report.trials)),
        ]))
    return


@app.cell(hide_code=True)
def _():
    mo.md(rf"""
    ## Workshop exercise

    `port` rewrote `tests/models/port/masks.py`'s `h[h > 0.5].mean()` in its masked form. The
    same model might want the largest element above 0.5, `{exercise.BLOCKED}`: the selection's
    shape depends on how many there are, so XLA compiles a new program whenever that number
    changes, and Dynamo breaks the graph there. **Write an expression of `h` (and `torch`)
    with the same value whose every op has a static shape.**
    """)
    return


@app.cell
def _():
    answer = mo.ui.text(placeholder="an expression of h", full_width=True).form(
        submit_button_label="check", bordered=False)
    answer
    return (answer,)


@app.cell
def _(answer):
    _kind, _verdict = exercise.judge_masked(answer.value)
    mo.callout(mo.md(_verdict), kind=_kind)
    return


if __name__ == "__main__":
    app.run()
