"""Lightning integration: one ``Callback`` with the same behaviour as the other trainers.

    parser = add_torch_profile_args(argparse.ArgumentParser())
    args = parser.parse_args()                  # a bad flag: one error line, exit 2
    trainer = pl.Trainer(strategy="ddp", accumulate_grad_batches=2,
                         callbacks=[torchprof_args.lightning.TorchProfileCallback(args)])
    trainer.fit(module, datamodule)

``ProfilerStep#N`` is ``trainer.global_step`` N (optimizer steps; a resumed fit continues the
numbering), every flush waits at the fence, the step timers, ``iteration-time``, ``throughput`` and
``mfu`` go to Lightning's loggers every ``log_every_n_steps``; Lightning's own ``profiler=`` is
refused with ``--torch-profile``.  Install with the ``lightning`` extra.
"""

from torchprof_args.capture.frameworks.lightning_callback import FLUSH_TIMER, TorchProfileCallback

__all__ = ["FLUSH_TIMER", "TorchProfileCallback"]
