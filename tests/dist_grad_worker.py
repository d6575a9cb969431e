"""Worker for tests/encoder/test_train.py::test_two_processes_give_the_one_process_gradient.

Computes one training step's gradient (no optimizer step) of the dual encoder on 8 fixed instances of the packaged
demo set: run plainly it takes all 8; under ``torchrun --nproc_per_node 2`` each process takes its 4 (rank 0 the
first 4, as the gathered batch orders them) and the gradients are summed across processes as in training.
Writes both towers' gradients (rank 0) to ``OUT``.

    python tests/dist_grad_worker.py OUT LOSS CHUNK ENCODER_DIR [DEVICE]

``DEVICE`` is ``cpu`` (default) or ``cuda`` (one process on the GPU: tests/test_cuda.py compares it with the CPU).
"""

import sys

import torch
from accelerate import Accelerator

from epr.config import DataConfig, TrainConfig
from epr.encoder import train as train_epr
from epr.encoder.data import LabelRow
from epr.encoder.model import DualEncoder
from epr.tasks import get_task


def main(out: str, loss: str, chunk: int, encoder: str, device: str = "cpu") -> None:
    acc = Accelerator(cpu=device == "cpu")
    task = get_task(DataConfig(task="demo"))
    pool, _ = task.load()
    rows = []
    for i in range(8):
        cands = tuple(range(10 + 5 * i, 16 + 5 * i))  # overlapping lists: shared in-batch documents
        rows.append(LabelRow(i, cands[:2], cands[-2:], cands, tuple(float(-j - 0.3 * i) for j in range(6))))
    per = len(rows) // acc.num_processes
    mine = rows[acc.process_index * per : (acc.process_index + 1) * per]
    tc = TrainConfig(
        loss=loss, chunk_size=chunk, list_size=4, similarity="cosine" if loss != "epr" else "dot"
    )
    model = DualEncoder.from_pretrained(encoder, similarity=tc.similarity).to(acc.device)
    model.eval()  # no dropout: the two runs must compute the same function
    batch = train_epr.make_batch(mine, tc, seed=0, epoch=0)
    loss_v = train_epr.compute_loss(model, batch, pool, task, tc, acc)
    train_epr.sum_gradients(model, acc)
    if acc.is_main_process:
        grads = {n: p.grad.cpu().clone() for n, p in model.named_parameters() if p.grad is not None}
        torch.save({"loss": float(loss_v), "grads": grads}, out)
    acc.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:6])
