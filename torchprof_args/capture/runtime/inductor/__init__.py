"""What the profiler has inductor (``torch.compile``) do while it compiles: :mod:`.kernel_modules`
notes which module each generated kernel came from (``--torch-profile-compiled-modules``)."""
