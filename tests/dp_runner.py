"""fairseq-train in a process of its own, recording what it trains on: run
as ``python dp_runner.py OUT ARGV...`` (``RANK`` in the environment, 0 for
a single process; a worker spawned by one command: its process group's
rank). Every update appends the sentence ids of each of its micro-batches
to ``OUT/ids.RANK`` (one line per update, micro-batches separated by ``|``,
``-`` for a padding batch), the update's logged statistics (the trainer's
return value) to ``OUT/stats.RANK`` (one JSON object a line), a digest of
the random state the update starts from (fairseq seeds it per update) to
``OUT/rng.RANK``, and rank 0 saves the model's parameters after the update
to ``OUT/params.K.pt`` (``K`` = the update's number, from 1). fairseq-train's
own entry (``cli_main``: argument parsing, ``distributed_utils.call_main``)
runs as a user runs it."""

import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import ctx_fairseq  # noqa: E402,F401
from fairseq.trainer import Trainer  # noqa: E402

# a worker spawned by one command re-runs this module with fairseq-train's arguments
# in sys.argv: it reads OUT from the environment its launcher set
OUT = os.environ.get("DP_RUNNER_OUT") or sys.argv[1]
_train_step = Trainer.train_step


def _rank() -> str:
    """This worker's rank: the process group's (a spawned worker), else
    ``RANK`` from the environment (0 for a single process)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return str(dist.get_rank())
    return os.environ.get("RANK", "0")


def train_step(self, samples, raise_oom=False):
    RANK = _rank()
    self._set_seed()  # what fairseq's train_step does first: record the stream it seeds
    state = hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest()
    with open(os.path.join(OUT, f"rng.{RANK}"), "a") as f:
        f.write(state + "\n")
    parts = [" ".join(map(str, s["id"].tolist())) if s else "-" for s in samples]
    with open(os.path.join(OUT, f"ids.{RANK}"), "a") as f:
        f.write(" | ".join(parts) + "\n")
    out = _train_step(self, samples, raise_oom=raise_oom)
    with open(os.path.join(OUT, f"stats.{RANK}"), "a") as f:
        f.write(json.dumps({k: float(v) for k, v in (out or {}).items()
                            if isinstance(v, (int, float)) or torch.is_tensor(v)}) + "\n")
    if RANK == "0":
        params = {n: p.detach().clone() for n, p in self.get_model().named_parameters()}
        torch.save(params, os.path.join(OUT, f"params.{self.get_num_updates()}.pt"))
    return out


Trainer.train_step = train_step

if __name__ == "__main__":
    from fairseq_cli.train import cli_main

    os.environ["DP_RUNNER_OUT"] = OUT
    sys.argv = ["fairseq-train"] + sys.argv[2:]
    cli_main()
