"""The Run form's memory: widget values kept across pages (session state) and refreshes (the URL), `?from=<job
id>` filling the form from a stored job, and each field's messages, checked as the fields change.

Widget keys are dropped when the page is left, so every field is seeded from FORM_KEY before it is drawn
and kept there after; the main ones are mirrored in the query string, which survives a refresh.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import data
from dashboard.views import query
from dashboard.views.run import form_values
from models.request.params import INPUT_FILE_FIELDS as INPUT_FILES

# Session keys (a page script must not hold bare strings: Streamlit would draw them).
FORM_KEY = "run_form"  # field -> value of the form, kept while the user is on other pages
FROM_KEY = "run_filled_from"  # id of the job whose spec filled the form (applied once per arrival)
ERRORS_KEY = "run_errors"  # {"spec": the form as submitted, "errors": field -> messages} from a refused submit
SLOTS_KEY = "run_error_slots"  # [(field names, the empty slot under their widget)] drawn in this script run
DRAWN_KEY = "run_drawn"  # fields drawn in this script run, kept at its end
VIDEO_KEY = "run_filled_from_video"  # file id of the dropped video whose settings filled the form (applied once)
CARRIED_KEY = "run_carried_inputs"  # {"job": id, "files": {field: that job's copy}}: edit and re-queue's inputs
# Fields mirrored in the query string, so a refreshed or shared URL opens the same form.
URL_FIELDS = ("checkpoint", "component", "kind", "mode", "device", "dtype")


def key(name: str) -> str:
    """The widget key of a form field."""
    return f"run_{name}"


def durable() -> dict[str, Any]:
    return st.session_state.setdefault(FORM_KEY, {})


def start_run() -> None:
    """Forget which fields and message slots the previous script run drew (the page draws a different set per
    job kind)."""
    st.session_state[DRAWN_KEY] = []
    st.session_state[SLOTS_KEY] = []


def seed(name: str, default: Any, options: list | tuple | None = None) -> None:
    """Give a widget its value before it is drawn: what it had, else the kept form value,
    else `default`; a value no longer among `options` falls back to `default`."""
    st.session_state.setdefault(DRAWN_KEY, []).append(name)
    value = st.session_state.get(key(name), durable().get(name, default))
    if options is not None and value not in options:
        value = default
    st.session_state[key(name)] = value


def keep(names: list[str]) -> None:
    """Remember these fields' values for the next visit."""
    durable().update({name: st.session_state[key(name)] for name in names if key(name) in st.session_state})


def keep_drawn() -> None:
    """Remember every field this run drew."""
    keep(st.session_state.get(DRAWN_KEY, []))


def keep_selection(name: str) -> None:
    """on_change of a segmented control: clicking the selected option must not leave nothing selected."""
    if st.session_state.get(key(name)) is None:
        st.session_state[key(name)] = durable().get(name)


def fill_from_query(db: str) -> None:
    """Apply `?from=<job id>` once per id (its spec fills every field), or, on a fresh session,
    the fields mirrored in the URL."""
    raw = st.query_params.get("from")
    try:
        job_id = None if raw is None else query.job_id(raw, name="from")
    except query.QueryError as e:
        st.warning(f"{e}. The form keeps its values.")
        job_id = None
    if job_id is None:
        st.session_state.pop(FROM_KEY, None)  # arriving with ?from= again fills the form again
    elif st.session_state.get(FROM_KEY) != job_id:
        job = data.job(db, job_id)
        if job is None:
            st.warning(f"There is no job {job_id} to fill the form from.")
        else:
            values = form_values(job["spec"])
            durable().update(values)
            for name in values:
                st.session_state.pop(key(name), None)  # seed() takes the job's value (if still offered)
            st.session_state[FROM_KEY] = job_id
            carry_inputs(job_id, job["spec"])
    if not durable():
        durable().update({name: st.query_params[name] for name in URL_FIELDS if st.query_params.get(name)})


def open_checkpoint(path: str) -> None:
    """Make `path` the Run form's checkpoint (the Models page's *Open in Run*): the form's other values stay."""
    durable()["checkpoint"] = path
    st.session_state.pop(key("checkpoint"), None)


def open_transformer(path: str) -> None:
    """Make `path`, a GGUF DiT, the Run form's single-file transformer of a generate (the Models page's *Open in
    Run*): the checkpoint and the form's other values stay."""
    durable().update({"kind": "generate", "gen_transformer": path})
    for name in ("kind", "gen_transformer"):
        st.session_state.pop(key(name), None)


def fill_from_video(file_id: str, settings: dict[str, Any], checkpoints: dict[str, str]) -> str:
    """Fill the generate fields (and the checkpoint, when one of that name is found: `checkpoints` maps a folder
    name to its path) from a dropped Drainboard video's settings (models.video.settings), once per file, and draw
    the page again with them; the other fields keep their values. Returns what was filled, in one line."""
    generate = {k: v for k, v in settings["generate"].items() if k not in INPUT_FILES}
    model = (settings.get("model") or {}).get("name")
    found = checkpoints.get(model) if isinstance(model, str) else None
    values = {k: v for k, v in form_values({"kind": "generate", "generate": generate}).items()
              if k == "kind" or k.startswith("gen_")}
    if found:
        values["checkpoint"] = found
    if st.session_state.get(VIDEO_KEY) != file_id:
        durable().update(values)
        for name in values:
            st.session_state.pop(key(name), None)  # seed() takes the video's value (if still offered)
        st.session_state[VIDEO_KEY] = file_id
        st.rerun()  # the form above is drawn already: draw it again with these values
    inputs = [settings["generate"][f] for f in INPUT_FILES if settings["generate"].get(f)]
    return (f"Filled from the video's settings (prompt, seed, workflow, size, frames, steps"
            + (f"; checkpoint {model}" if found else f"; its checkpoint {model!r} is not under the model roots"
               if model else "") + ")"
            + (f". Upload its inputs again: {', '.join(map(str, inputs))}." if inputs else "."))


def carry_inputs(job_id: int, spec: dict[str, Any]) -> None:
    """Keep job `job_id`'s own copies of its input files for the form (an uploader cannot be pre-filled), and say
    which are gone."""
    from jobs.input_copies import input_copies
    from models.request.params import INPUT_FILE_FIELDS
    from storage.artifacts import ArtifactError

    given = [f for f in INPUT_FILE_FIELDS if (spec.get("generate") or {}).get(f)]
    files = {}
    for field in given:
        try:
            files |= input_copies(data.config().data_dir, job_id, [field])
        except ArtifactError as e:
            st.warning(f"Job {job_id}'s {field} is gone ({e}); upload it again.")
    st.session_state[CARRIED_KEY] = {"job": job_id, "files": files}


def carried_inputs() -> tuple[int | None, dict[str, str]]:
    """(the job, field -> its copy) of the input files carried in by edit and re-queue, until removed."""
    carried = st.session_state.get(CARRIED_KEY) or {}
    return carried.get("job"), carried.get("files", {})


def drop_carried(field: str) -> None:
    """on_click of a carried input's Remove: the form no longer sends it."""
    st.session_state.get(CARRIED_KEY, {}).get("files", {}).pop(field, None)


def mirror_in_url() -> None:
    """The main fields into the query string (`from` stays while the form is filled from it)."""
    params = {name: str(durable()[name]) for name in URL_FIELDS if durable().get(name) not in (None, "")}
    if st.session_state.get(FROM_KEY) is not None:
        params["from"] = str(st.session_state[FROM_KEY])
    if dict(st.query_params) != params:
        st.query_params.from_dict(params)


def show_errors(*names: str) -> None:
    """A slot right under the widget for these fields' messages, filled by `fill_errors` once the whole form
    is read (the form is checked after its last field is drawn)."""
    st.session_state.setdefault(SLOTS_KEY, []).append((names, st.empty()))


def fill_errors(errors: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each field's messages into the slot under its widget (an empty slot clears a fixed one); returns the
    messages of fields with no slot drawn, for the page to say elsewhere."""
    placed = set()
    for names, slot in st.session_state.get(SLOTS_KEY, []):
        messages = [m for name in names for m in errors.get(name, [])]
        placed.update(names)
        if messages:
            slot.error("\n\n".join(messages), icon=":material/error:")
        else:
            slot.empty()
    return {name: messages for name, messages in errors.items() if name not in placed}
