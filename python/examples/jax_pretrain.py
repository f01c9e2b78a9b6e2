"""Feed a JAX pretraining step from a packed, weighted mixture: each process loads its own
rank's rows and `jax.make_array_from_process_local_data` assembles the global batch.

    python3 python/examples/jax_pretrain.py web=0.6 code=0.3 math=0.1 --pack-to 4096 --steps 100

On a multi-host TPU/GPU job, call `jax.distributed.initialize()` first: each process is
one rank of the loader (`jax.process_index()` of `jax.process_count()`), and the global batch
is sharded over all devices along its first axis. Checkpoint the loader with
`loader.state_dict()` per process; a job restarted on another number of hosts resumes with
`loader.load_state_dict([every process's state])`.
"""

from __future__ import annotations

import argparse
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import shardfeed


def global_batches(
    sources: dict[str, float], rows_per_process: int, pack_to: int, **options
) -> Iterator[dict[str, jax.Array]]:
    """Packed batches as global arrays sharded over every device (first axis)."""
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    loader = shardfeed.Loader(
        sources,
        batch_size=rows_per_process,
        pack_to=pack_to,
        rank=jax.process_index(),
        world_size=jax.process_count(),
        mix_stop="never",
        **options,
    )
    global_shape = (rows_per_process * jax.process_count(), pack_to)
    for batch in loader:
        yield {
            name: jax.make_array_from_process_local_data(sharding, batch[name], global_shape)
            for name in ("input_ids", "position_ids", "segment_ids")
        }


@jax.jit
def step(batch: dict[str, jax.Array]) -> jax.Array:
    """Stands in for a model: tokens per document segment, summed."""
    real = batch["segment_ids"] > 0
    return jnp.sum(jnp.where(real, 1, 0)) + jnp.sum(batch["position_ids"] == 0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("sources", nargs="+", help="URL=WEIGHT")
    p.add_argument("--pack-to", type=int, default=4096)
    p.add_argument("--rows", type=int, default=8, help="packed rows per process and step")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--eos-id", type=int, default=None)
    a = p.parse_args()
    sources = {u: float(w) for u, w in (s.rsplit("=", 1) for s in a.sources)}
    batches = global_batches(sources, a.rows, a.pack_to, eos_id=a.eos_id)
    for i, batch in zip(range(a.steps), batches):
        out = step(batch)
        if i % 10 == 0:
            print(f"step {i}: {int(out)} tokens + document starts")


if __name__ == "__main__":
    main()
