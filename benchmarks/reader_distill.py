"""Distil the span reader into a shallower, faster one (knowledge distillation, Hinton et al. 2015).

    .venv/bin/python -m benchmarks.squad_reader reconstruct                 # the shipped reader as a checkpoint
    .venv/bin/python -m benchmarks.reader_distill --layers 4 --questions 8000 --name distil4
    .venv/bin/python -m benchmarks.squad_reader export --checkpoint distil4 --output /tmp/distil4.onnx

The teacher is the reader the service ships (``squad_reader reconstruct``). The student starts as
a copy of it keeping ``--layers`` of its six layers, evenly spaced (the first and the last kept, as
DistilBERT initialised its student from every other layer), and learns on the SQuAD training
passages ``squad_reader train`` makes (``training_items``, the same seed): the loss is ``--alpha``
times the cross-entropy on the answer's span (or "no answer" at [CLS]) plus the rest times the
Kullback-Leibler divergence from the teacher's start and end distributions at temperature ``--temperature``
(multiplied by its square, so the gradients keep their scale), padding left out of both
distributions. The reader's time follows its layers: issue 16's latency budget is what this is for.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from benchmarks.squad_reader import CHECKPOINTS, SAME_PARAGRAPH, SEED, SIBLING, squad_train, training_items


def kept_layers(total: int, keep: int) -> list[int]:
    """``keep`` of ``total`` layer indices, evenly spaced, the first and the last among them."""
    if not 1 <= keep <= total:
        raise ValueError(f"keep 1 to {total} layers, not {keep}")
    if keep == 1:
        return [0]
    return sorted({round(i * (total - 1) / (keep - 1)) for i in range(keep)})


def distillation_loss(student_logits, teacher_logits, mask, temperature: float):  # noqa: ANN001, ANN201 - tensors
    """KL(teacher || student) over the positions ``mask`` keeps, at ``temperature``, times its square."""
    import torch

    hidden = torch.finfo(student_logits.dtype).min  # masked after the division: finfo.min / T < 1 is -inf
    s = torch.log_softmax((student_logits / temperature).masked_fill(~mask, hidden), dim=-1)
    t = torch.softmax((teacher_logits / temperature).masked_fill(~mask, hidden), dim=-1)
    return torch.nn.functional.kl_div(s, t, reduction="batchmean") * temperature ** 2


def main() -> None:
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    from benchmarks.reader_cv import bert_schedule, encode

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", default="shipped", help=f"the teacher's checkpoint (a folder under {CHECKPOINTS})")
    parser.add_argument("--layers", type=int, default=4, help="the student's layers (of the teacher's six)")
    parser.add_argument("--questions", type=int, default=8000, help="SQuAD questions sampled (as squad_reader train)")
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--alpha", type=float, default=0.5, help="the share of the loss on the gold span")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--name", default="distilled", help=f"the student's folder under {CHECKPOINTS}")
    args = parser.parse_args()

    torch.manual_seed(SEED)
    torch.set_num_threads(os.cpu_count() or 1)
    rng = np.random.default_rng(SEED)
    items = training_items(squad_train(), args.questions, SAME_PARAGRAPH, SIBLING, rng)
    source = CHECKPOINTS / args.teacher
    tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    teacher = AutoModelForQuestionAnswering.from_pretrained(str(source), local_files_only=True).eval()
    student = AutoModelForQuestionAnswering.from_pretrained(str(source), local_files_only=True)
    keep = kept_layers(student.config.num_hidden_layers, args.layers)
    student.bert.encoder.layer = torch.nn.ModuleList([student.bert.encoder.layer[k] for k in keep])
    student.config.num_hidden_layers = len(keep)
    print(f"{len(items)} passages; the student keeps layers {keep}", flush=True)
    optimiser = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=0.01)
    steps = -(-len(items) // args.batch)
    schedule = bert_schedule(optimiser, steps)
    target = CHECKPOINTS / args.name
    target.mkdir(parents=True, exist_ok=True)
    student.train()
    started, losses = time.perf_counter(), []
    order = rng.permutation(len(items))
    for step, b in enumerate(range(0, len(items), args.batch), start=1):
        enc, starts, ends = encode(tokenizer, [items[j] for j in order[b:b + args.batch]])
        inputs = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        with torch.no_grad():
            taught = teacher(**inputs)
        out = student(**inputs, start_positions=starts, end_positions=ends)
        mask = enc["attention_mask"].bool()
        soft = (distillation_loss(out.start_logits, taught.start_logits, mask, args.temperature)
                + distillation_loss(out.end_logits, taught.end_logits, mask, args.temperature)) / 2
        loss = args.alpha * out.loss + (1 - args.alpha) * soft
        loss.backward()
        optimiser.step()
        schedule.step()
        optimiser.zero_grad()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps:
            print(f"step {step}/{steps}  loss {np.mean(losses[-50:]):.3f}  {time.perf_counter() - started:.0f} s",
                  flush=True)
    student.save_pretrained(target)
    tokenizer.save_pretrained(target)
    (target / "progress.json").write_text(json.dumps(
        {"step": steps, "steps": steps, "items": len(items), "args": vars(args), "layers_kept": keep}))


if __name__ == "__main__":
    main()
