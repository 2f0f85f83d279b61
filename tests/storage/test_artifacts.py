import pytest

from storage.artifacts import ArtifactError, job_dir, new_artifact_path, record_artifact, resolve_artifact
from storage.queries import artifacts


def test_artifact_names_are_generated_and_numbered(tmp_path):
    first = new_artifact_path(tmp_path, 7, "video", ".mp4")
    first.write_bytes(b"x")
    second = new_artifact_path(tmp_path, 7, "video", ".mp4")
    assert first == tmp_path.resolve() / "artifacts" / "7" / "video.mp4"
    assert second.name == "video-2.mp4"


@pytest.mark.parametrize("role, suffix", [("../x", ".mp4"), ("Video", ".mp4"), ("video", ".sh"), ("", ".mp4")])
def test_unusual_roles_and_suffixes_are_refused(tmp_path, role, suffix):
    with pytest.raises(ArtifactError):
        new_artifact_path(tmp_path, 1, role, suffix)


def test_recording_an_artifact_stores_size_and_media_type(fresh_db, tmp_path, add_job):
    job = add_job(fresh_db)
    path = new_artifact_path(tmp_path, job, "report", ".json")
    path.write_text("{}")
    record_artifact(fresh_db, tmp_path, job, path)
    [row] = artifacts(fresh_db, job)
    assert (row["name"], row["size"], row["media_type"]) == ("report.json", 2, "application/json")


@pytest.mark.parametrize("name", ["../2/video.mp4", "/etc/passwd", "..", "sub/video.mp4", "link.mp4", "missing.mp4"])
def test_downloads_outside_the_jobs_folder_are_refused(tmp_path, name):
    for job in (1, 2):
        job_dir(tmp_path, job).mkdir(parents=True)
        (job_dir(tmp_path, job) / "video.mp4").write_bytes(b"v")
    (job_dir(tmp_path, 1) / "sub").mkdir()
    (job_dir(tmp_path, 1) / "sub" / "video.mp4").write_bytes(b"v")
    (job_dir(tmp_path, 1) / "link.mp4").symlink_to(job_dir(tmp_path, 2) / "video.mp4")
    assert resolve_artifact(tmp_path, 1, "video.mp4").read_bytes() == b"v"
    with pytest.raises(ArtifactError):
        resolve_artifact(tmp_path, 1, name)
