"""The Run page's workflow section and the Job page's input strip, each under AppTest on its own."""

from __future__ import annotations

import io
import json
from pathlib import Path

from PIL import Image
from streamlit.testing.v1 import AppTest


def _png(color=(200, 10, 10)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (80, 48), color).save(out, "PNG")
    return out.getvalue()


def _section(data_dir: str):
    import json

    import streamlit as st

    from dashboard.inputs_panel import workflow_section

    st.code(json.dumps(workflow_section(data_dir, True)), language="json")


def test_fl2va_offers_two_uploaders_previews_an_upload_and_feeds_the_spec(tmp_path: Path):
    at = AppTest.from_function(_section, args=(str(tmp_path),), default_timeout=60).run()
    assert not at.exception and not at.get("file_uploader")  # t2va takes no image
    assert json.loads(at.code[0].value) == {"workflow": "t2va"}
    at.selectbox(key="run_gen_workflow").set_value("fl2va").run()
    uploaders = at.get("file_uploader")
    assert [u.label for u in uploaders] == ["First frame", "Last frame"]
    uploaders[0].set_value(("frame.png", _png(), "image/png")).run()
    fields = json.loads(at.code[0].value)
    saved = Path(fields["image"])
    assert fields["workflow"] == "fl2va" and "last_image" not in fields
    assert saved.parent == tmp_path / "uploads" and saved.read_bytes() == _png()
    assert [i.captions for i in at.get("image")] == [["frame.png"]]  # the preview


def test_the_stage_plan_covers_every_workflow_and_names_a_quantized_dit():
    from dashboard.inputs_panel import plan_table

    fl2va = plan_table("fl2va", True, sequential=True)
    assert list(fl2va["stage"]) == ["encoding the prompt", "encoding the images", "denoising", "decoding the video",
                                    "decoding the audio"]
    assert list(fl2va["resident"]) == ["text encoder", "video decoder", "transformer", "video decoder", "audio decoder"]
    ref2va = plan_table("ref2va", True, sequential=True, quantize="int8")
    assert "reference transformer (int8 weights)" in set(ref2va["resident"])
    assert not any("transformer (int8" in r and "reference" not in r for r in ref2va["resident"])  # never both DiTs
    resident = plan_table("t2va", False, sequential=False, quantize="fp8")
    assert list(resident["stage"]) == ["encoding the prompt", "denoising", "decoding the video"]  # no audio block
    assert set(resident["resident"]) == {"text encoder, transformer (fp8 weights), video decoder"}  # all, from the start


def _strip(folder: str):
    from pathlib import Path

    from dashboard.inputs_panel import input_strip

    artifacts = [{"name": "image.png", "media_type": "image/png"}, {"name": "ref_image.png", "media_type": "image/png"},
                 {"name": "video.mp4", "media_type": "video/mp4"}]
    input_strip(artifacts, lambda name: Path(folder) / name)


def test_the_job_page_strip_shows_each_input_image_with_its_role(tmp_path: Path):
    for name in ("image.png", "ref_image.png"):
        (tmp_path / name).write_bytes(_png())
    at = AppTest.from_function(_strip, args=(str(tmp_path),), default_timeout=60).run()
    assert not at.exception
    captions = [c for image in at.get("image") for c in image.captions]
    assert captions == ["First frame (image.png)", "Reference image (ref_image.png)"]


def test_a_reference_clip_copied_in_is_not_shown_as_the_job_s_video():
    from dashboard.inputs_panel import output_videos

    artifacts = [{"name": "ref_video.mp4"}, {"name": "image.png"}, {"name": "video.mp4"}, {"name": "child.log"}]
    assert [a["name"] for a in output_videos(artifacts)] == ["video.mp4"]


def test_ref2va_offers_an_image_and_a_clip_uploader_and_the_clip_feeds_the_spec(tmp_path: Path):
    at = AppTest.from_function(_section, args=(str(tmp_path),), default_timeout=60).run()
    at.selectbox(key="run_gen_workflow").set_value("ref2va").run()
    uploaders = at.get("file_uploader")
    assert [u.label for u in uploaders] == ["Reference image", "Reference clip"]
    body = b"\x00\x00\x00\x18ftypmp42"  # the page stores the upload as given; submit checks the clip itself
    uploaders[1].set_value(("motion.mp4", body, "video/mp4")).run()
    fields = json.loads(at.code[0].value)
    saved = Path(fields["ref_video"])
    assert fields["workflow"] == "ref2va" and "ref_image" not in fields
    assert saved.suffix == ".mp4" and saved.read_bytes() == body
    assert any("motion.mp4" in c.value for c in at.caption)


def _strip_with_clip(folder: str):
    from pathlib import Path

    from dashboard.inputs_panel import input_strip

    artifacts = [{"name": "ref_video.mp4", "media_type": "video/mp4"}, {"name": "video.mp4", "media_type": "video/mp4"}]
    input_strip(artifacts, lambda name: Path(folder) / name)


def test_the_job_page_strip_shows_the_reference_clip_and_not_the_output(tmp_path: Path):
    (tmp_path / "ref_video.mp4").write_bytes(b"clip")
    at = AppTest.from_function(_strip_with_clip, args=(str(tmp_path),), default_timeout=60).run()
    assert not at.exception
    assert [c.value for c in at.caption] == ["Reference clip (ref_video.mp4)"]
    assert len(at.get("video")) == 1


def _carried_section(data_dir: str, image: str):
    import json

    import streamlit as st

    from dashboard.inputs_panel import workflow_section

    files = st.session_state.setdefault("files", {"image": image})
    st.session_state.setdefault("run_gen_workflow", "fl2va")
    st.code(json.dumps(workflow_section(data_dir, True, (7, files), files.pop)), language="json")


def test_an_input_carried_from_a_job_is_sent_and_shown_until_removed(tmp_path: Path):
    copy = tmp_path / "image.png"
    copy.write_bytes(_png())
    at = AppTest.from_function(_carried_section, args=(str(tmp_path), str(copy)), default_timeout=60).run()
    assert not at.exception, at.exception
    assert json.loads(at.code[0].value)["image"] == str(copy)
    assert [c for image in at.get("image") for c in image.captions] == ["image.png from job 7"]
    at.button(key="run_gen_remove_image").click().run()
    assert "image" not in json.loads(at.code[0].value) and not at.get("image")
    uploaders = at.get("file_uploader")
    uploaders[0].set_value(("mine.png", _png((0, 0, 200)), "image/png")).run()
    assert Path(json.loads(at.code[0].value)["image"]).parent == tmp_path / "uploads"


def test_a_file_that_is_not_an_image_is_named_in_one_line_and_not_kept(tmp_path: Path):
    at = AppTest.from_function(_section, args=(str(tmp_path),), default_timeout=60).run()
    at.selectbox(key="run_gen_workflow").set_value("fl2va").run()
    at.get("file_uploader")[0].set_value(("holiday.png", b"this is a text file, not a PNG", "image/png")).run()
    assert not at.exception, at.exception
    assert len(at.error) == 1
    message = at.error[0].value
    assert message.startswith("'holiday.png': not a readable image") and message.endswith("Nothing was kept.")
    assert "\n" not in message and "uploads" not in message  # one line, no server path
    assert "image" not in json.loads(at.code[0].value)
    assert list((tmp_path / "uploads").iterdir()) == []


def test_an_upload_over_its_limit_is_refused_before_a_byte_is_written(tmp_path: Path):
    import pytest

    from dashboard.inputs_panel import UploadError, save_upload

    def body() -> bytes:
        raise AssertionError("the body of an upload over the limit was read")

    with pytest.raises(UploadError, match=r"^'huge.png' is 190 MiB: images up to 32 MiB are accepted"):
        save_upload(tmp_path, "huge.png", 190 * 2**20, body, clip=False)
    with pytest.raises(UploadError, match=r"clips up to 256 MiB"):
        save_upload(tmp_path, "long.mp4", 257 * 2**20, body, clip=True)
    assert not (tmp_path / "uploads").exists()


def test_each_uploader_states_and_asks_for_the_limit_submit_enforces(tmp_path: Path):
    at = AppTest.from_function(_section, args=(str(tmp_path),), default_timeout=60).run()
    at.selectbox(key="run_gen_workflow").set_value("ref2va").run()
    limits = [u.proto.max_upload_size_mb for u in at.get("file_uploader")]
    assert limits == [32, 256]
    captions = [c.value for c in at.caption]
    assert "PNG, JPEG or WebP, up to 32 MiB" in captions and any("up to 256 MiB and 60 s" in c for c in captions)


def test_uploads_no_queued_job_names_are_removed_once_old(tmp_path: Path):
    import os

    from dashboard.inputs_panel import prune_uploads, queued_inputs

    folder = tmp_path / "uploads"
    folder.mkdir()
    old, queued, fresh, ran = (folder / f"{n}.png" for n in ("old", "queued", "fresh", "ran"))
    for path in (old, queued, fresh, ran):
        path.write_bytes(b"x")
    for path in (old, queued, ran):
        os.utime(path, (1_000, 1_000))
    jobs = [{"status": "queued", "spec": {"generate": {"image": str(queued), "prompt": "p"}}},
            {"status": "running", "spec": {"generate": {"image": str(ran)}}},
            {"status": "queued", "spec": {"kind": "load"}}]
    assert queued_inputs(jobs) == [str(queued)]
    removed = prune_uploads(tmp_path, queued_inputs(jobs))
    assert sorted(p.name for p in removed) == ["old.png", "ran.png"]  # a running job reads its own copy
    assert sorted(p.name for p in folder.iterdir()) == ["fresh.png", "queued.png"]


def test_streamlit_reads_the_project_config_wherever_the_dashboard_is_started(tmp_path: Path, monkeypatch):
    from streamlit import config as st_config

    from dashboard.nav import ROOT

    monkeypatch.chdir(tmp_path)  # `streamlit run /path/to/app.py` from elsewhere: the app folder's config applies
    monkeypatch.setattr(st_config, "_main_script_path", str(ROOT / "app.py"))
    try:
        st_config.get_config_options(force_reparse=True)
        assert st_config.get_option("client.showErrorDetails") == "none"
        assert st_config.get_option("server.maxUploadSize") == 256
    finally:
        monkeypatch.undo()
        st_config.get_config_options(force_reparse=True)
