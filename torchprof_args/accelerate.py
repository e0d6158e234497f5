"""Hugging Face Accelerate: the plain-loop profiler under an ``Accelerator``.

    accelerator = Accelerator(gradient_accumulation_steps=2)      # the process group, the ranks
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    step = 0
    with torchprof_args.accelerate.profiler(accelerator, args) as prof:   # every rank
        for batch in loader:
            with accelerator.accumulate(model):
                accelerator.backward(model(batch).loss)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:      # an optimizer step: the profiler's step boundary
                step += 1
                prof.step(step)

``ProfilerStep#N`` is optimizer step N (``sync_gradients`` is true after the last micro-batch of each
accumulation window), never a micro-batch; every flush waits at the fence.  Step timers and MFU come
from the plain-loop API (``Timers``, ``MetricsWriter``).  Install Accelerate (the ``huggingface`` extra).
"""

from torchprof_args.capture.frameworks.accelerate_loop import accelerate_layout
from torchprof_args.capture.frameworks.accelerate_loop import accelerate_profiler as profiler

__all__ = ["accelerate_layout", "profiler"]
