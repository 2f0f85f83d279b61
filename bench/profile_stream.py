"""Profile (not a test): where `stream`'s one Python thread spends a CUDA load, in this fresh process.

    python bench/profile_stream.py /tmp/pruned-r16 "{}"                     # timed, with the ring's stats
    python bench/profile_stream.py /tmp/pruned-r16 "{'io_uring': False}"     # the threads reader
    python bench/profile_stream.py /tmp/pruned-r16 "{}" --prof              # under cProfile: top 25 by own time
"""
import ast, cProfile, io, pstats, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch
from loader import load_checkpoint
from loader.placement import get_placement
torch.empty(0, device="cuda")
opts = ast.literal_eval(sys.argv[2]) if len(sys.argv) > 2 else {}
p = get_placement("stream", **opts)
prof = cProfile.Profile() if "--prof" in sys.argv else None
t = time.perf_counter()
if prof: prof.enable()
m, r = load_checkpoint(sys.argv[1], mode=p, device="cuda")
torch.cuda.synchronize()
if prof: prof.disable()
print(opts, "wall", round(time.perf_counter() - t, 3), "load_seconds", round(r.load_seconds, 3), vars(p.last_ring))
if prof:
    s = io.StringIO(); st = pstats.Stats(prof, stream=s); st.sort_stats("tottime").print_stats(25); st.sort_stats("cumulative").print_stats(30)
    print(s.getvalue())
