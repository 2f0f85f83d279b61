import threading

from storage.schema import open_database
from storage.queries import sample_count, samples_since
from storage.sample_writer import SampleWriter


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_samples_are_held_until_the_batch_is_full(fresh_db, db_path, add_job, memory_sample):
    job = add_job(fresh_db)
    with SampleWriter(db_path, job, t0=0.0, batch_size=3, flush_interval=3600, clock=FakeClock()) as writer:
        writer.add(memory_sample(0))
        writer.add(memory_sample(1))
        assert sample_count(fresh_db, job) == 0
        writer.add(memory_sample(2))
        assert sample_count(fresh_db, job) == 3


def test_samples_are_written_once_the_flush_interval_passes(fresh_db, db_path, add_job, memory_sample):
    job, clock = add_job(fresh_db), FakeClock()
    with SampleWriter(db_path, job, t0=0.0, batch_size=1000, flush_interval=3600, clock=clock) as writer:
        writer.add(memory_sample(0))
        clock.now = 3601
        writer.add(memory_sample(1))
        assert sample_count(fresh_db, job) == 2


def test_close_writes_what_is_left_with_fields_and_relative_time(fresh_db, db_path, add_job, memory_sample):
    job = add_job(fresh_db)
    writer = SampleWriter(db_path, job, t0=100.0, batch_size=1000, flush_interval=3600)
    writer.add(memory_sample(0, t=102.5), stage="load", tensors_placed=1, bytes_placed=64, tensor_name="a.weight")
    writer.close()
    writer.close()
    [row] = samples_since(fresh_db, job)
    assert row["t"] == 2.5 and row["seq"] == 0 and row["rank"] == 0
    assert (row["stage"], row["tensors_placed"], row["bytes_placed"], row["tensor_name"]) == ("load", 1, 64, "a.weight")
    assert (row["vm_rss"], row["mem_available"]) == (1000, 10**9)


def test_a_second_writer_for_the_same_job_continues_the_sequence(fresh_db, db_path, add_job, memory_sample):
    job = add_job(fresh_db)
    for _ in range(2):
        with SampleWriter(db_path, job, t0=0.0) as writer:
            writer.add(memory_sample(0))
            writer.add(memory_sample(1))
    assert [r["seq"] for r in samples_since(fresh_db, job)] == [0, 1, 2, 3]


def test_one_writer_at_full_speed_and_several_readers_never_hit_a_locked_database(fresh_db, db_path, add_job, memory_sample):
    job, total = add_job(fresh_db), 20_000
    errors, reads = [], []
    done = threading.Event()

    def poll():
        db = open_database(db_path)
        try:
            seen = -1
            while not done.is_set():
                rows = samples_since(db, job, seen)
                if rows:
                    assert rows[0]["seq"] == seen + 1
                    seen = rows[-1]["seq"]
                reads.append(len(rows))
        except Exception as e:  # collected, asserted below
            errors.append(e)

    readers = [threading.Thread(target=poll) for _ in range(3)]
    for r in readers:
        r.start()
    with SampleWriter(db_path, job, t0=0.0, batch_size=64, flush_interval=0.01) as writer:
        for i in range(total):
            writer.add(memory_sample(i))
    done.set()
    for r in readers:
        r.join()
    assert errors == []
    assert len(reads) > 3
    assert sample_count(fresh_db, job) == total
    assert [r["seq"] for r in samples_since(fresh_db, job, limit=total)] == list(range(total))
