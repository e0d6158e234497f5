"""DeepSpeed integration: profile a ``DeepSpeedEngine`` on optimizer steps, with its own timers.

    engine, *_ = deepspeed.initialize(args=args, model=model, ...)
    engine.load_checkpoint(...)                       # optional: numbering continues from it
    with torchprof_args.deepspeed.attach(engine, args, metrics=writer):
        ...  loss = engine(batch); engine.backward(loss); engine.step()

:func:`attach` wraps ``engine.step`` on this engine object only (DeepSpeed's source and class are
untouched): the profiler steps once per *optimizer* step, i.e. when ``engine.step()`` ran on a
gradient-accumulation boundary, with the 1-based global step ``engine.global_steps``; micro-steps
inside an accumulation window are not profiler steps.  A pipeline-parallel ``PipelineEngine``
takes its optimizer step inside ``train_batch()`` (its ``step()`` is disabled), so there
``train_batch`` is wrapped instead: ``ProfilerStep#N`` is the whole batch N on every stage (all
micro-batches, the optimizer step, the loss reduction), and every stage reaches each flush at the
same step.  When the ds_config enables them:

* ``wall_clock_breakdown``: DeepSpeed's per-step forward/backward/all-reduce/step timers go to the
  metrics writer (max across ranks) every ``--log-interval`` optimizer steps, as
  ``deepspeed/<timer>-ms``;
* ``flops_profiler`` (without its own ``output_file``): the report is written to
  ``profiler_ds.txt`` in the profile directory, published atomically; the forward FLOPs it
  measured at its ``profile_step`` give the model FLOPs of one optimizer step (x3 for forward and
  backward, x gradient accumulation steps, x world size), sent to the metrics writer as
  ``throughput/model-flops-per-iteration`` from then on: the writer logs ``throughput``
  (TFLOP/s per GPU) and ``mfu`` from it (``--metrics-flops-per-iteration`` takes precedence).
"""

from torchprof_args.capture.frameworks.deepspeed_engine import (
    FLOPS_REPORT_NAME,
    DeepSpeedProfilerHook,
    attach,
    is_pipeline_engine,
)

__all__ = ["FLOPS_REPORT_NAME", "DeepSpeedProfilerHook", "attach", "is_pipeline_engine"]
