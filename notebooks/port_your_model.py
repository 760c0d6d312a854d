import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="tpu-workbench: port your model")

with app.setup:
    import marimo as mo

    import tpu_workbench as wb
    from tpu_workbench import notebook as nb
    from tpu_workbench.exercises import port_your_model as exercise
    from tpu_workbench.porting.findings import context

    SMOKE = wb.smoke_mode()
    # Example models with planted blockers (None outside a checkout of the workbench), then
    # the workbench's own clean ones.
    EXAMPLES = {
        _label: _ref for _label, _ref in {
            "a text classifier, written for a GPU (tests/models/port_shapes.py)":
                nb.example_model("port_shapes"),
            "a scorer that stops Dynamo (tests/models/port_masks.py)":
                nb.example_model("port_masks"),
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
    mechanical porting step: a `.item()` that waits for the device every step, a new sequence
    length every batch (a new XLA compilation each time), a boolean-mask index whose shape
    depends on the data, a tensor made on the CPU inside `forward`, float64. `port` runs a few
    training steps of your model in torch_xla's lazy mode and under `torch.compile` on
    XLA:CPU (the same HLO a TPU compiles) and names **each blocker at its line**, with the
    counter that shows it and the fix. Where the fix needs no edit of your file (padding the
    batches to buckets, making tensors on the device, running float64 as float32) the workbench
    runs it and says what changed, **before -> after**. Where it needs a mechanical edit of a
    line (a logged `.item()` moved after the step, a mask's mean in its masked form, a median
    as a sort), the workbench edits a copy (`patched/` beside the report), runs that and
    measures it the same way. Your file is never changed.

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
            report.findings.drop(columns=["file", "line"]), selection="single",
            initial_selection=[0], label=f"{len(report.findings)} blockers in {report.label}, "
            "costliest first (cost_s: step time the fix saved; empty where it was not tried)")
        mo.output.replace(mo.vstack([
            mo.md("**Click a row** to see its line in context, the fix and what it changed."),
            findings_table]))
    return (findings_table,)


@app.cell
def _(findings_table, report):
    _chosen = (findings_table.value if findings_table is not None else None)
    if report is not None and _chosen is not None and len(_chosen):
        _pick = _chosen.iloc[0]
        _row = report.findings[(report.findings["kind"] == _pick["kind"])
                               & (report.findings["where"] == _pick["where"])].iloc[0]
        _variant = {"shapes": "pad to buckets", "cpu_tensor": "on device",
                    "float64": "float32"}.get(_row["kind"], "edited")
        _tried = _variant in set(report.steps["variant"]) and bool(_row["verified"])
        mo.output.replace(mo.vstack([
            mo.md(f"### {_row['kind']} at `{_row['where']}`\n\n"
                  f"_{wb.PORT_KINDS[_row['kind']]}._\n\n"
                  + context(_row["file"], int(_row["line"]))
                  + f"\n\n**Evidence:** {_row['evidence']}\n\n**Fix:**\n\n```diff\n"
                  + _row["fix"] + "\n```\n\n"
                  + (f"**Verified:** {_row['verified']}" if _tried else
                     "**Not tried:** this fix needs an edit only you can judge.")),
            wb.charts.port_steps(report.steps, ["as written", _variant] if _tried
                                 else ["as written"]),
        ]))
    return


@app.cell(hide_code=True)
def _():
    mo.md(rf"""
    ## Workshop exercise

    `port` rewrote `tests/models/port_masks.py`'s `h[h > 0.5].mean()` in its masked form. The
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
