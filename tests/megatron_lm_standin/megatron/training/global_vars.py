"""Stand-in for Megatron-LM's global_vars.py (timers are torchprof_args.Timers, a drop-in for
megatron.core.timers.Timers, because megatron-core's need CUDA)."""

_GLOBAL_ARGS = None
_GLOBAL_TIMERS = None
_GLOBAL_TENSORBOARD_WRITER = None
_GLOBAL_WANDB_WRITER = None


def get_args():
    return _GLOBAL_ARGS


def get_timers():
    return _GLOBAL_TIMERS


def get_tensorboard_writer():
    return _GLOBAL_TENSORBOARD_WRITER


def get_wandb_writer():
    return _GLOBAL_WANDB_WRITER


def set_global_variables(args):
    global _GLOBAL_ARGS, _GLOBAL_TIMERS, _GLOBAL_TENSORBOARD_WRITER
    from torchprof_args import Timers

    _GLOBAL_ARGS = args
    _GLOBAL_TIMERS = Timers(args.timing_log_level, args.timing_log_option)
    if args.tensorboard_dir and args.rank == args.world_size - 1:  # Megatron writes on the last rank
        from torch.utils.tensorboard import SummaryWriter

        _GLOBAL_TENSORBOARD_WRITER = SummaryWriter(log_dir=args.tensorboard_dir, max_queue=1000)
