"""Stand-in for Megatron-LM's training.py: pretrain -> train -> train_step / training_log."""

import datetime
import os

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from .arguments import parse_and_validate_args
from .global_vars import get_args, get_tensorboard_writer, get_timers, set_global_variables


def initialize_megatron(extra_args_provider=None, args_defaults=None):
    args = parse_and_validate_args(extra_args_provider, args_defaults)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
    )
    torch.manual_seed(args.seed)
    set_global_variables(args)


def _checkpoint_file(root, iteration):
    tp = parallel_state.get_tensor_model_parallel_rank()
    return os.path.join(root, f"iter_{iteration:07d}", f"mp_rank_{tp:02d}.pt")


def save_checkpoint(iteration, model, optimizer):
    args = get_args()
    if parallel_state.get_data_parallel_rank() == 0:
        path = _checkpoint_file(args.save, iteration)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save({"iteration": iteration, "model": model[0].state_dict(),
                    "optimizer": optimizer.state_dict()}, path)
    dist.barrier()
    if dist.get_rank() == 0:
        with open(os.path.join(args.save, "latest_checkpointed_iteration.txt"), "w") as handle:
            handle.write(str(iteration))


def load_checkpoint(model, optimizer):
    args = get_args()
    tracker = os.path.join(args.load or "", "latest_checkpointed_iteration.txt")
    if not args.load or not os.path.exists(tracker):
        return 0
    with open(tracker) as handle:
        iteration = int(handle.read())
    state = torch.load(_checkpoint_file(args.load, iteration), weights_only=False)
    model[0].load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return iteration


def pretrain(train_valid_test_dataset_provider, model_provider, model_type, forward_step_func,
             process_non_loss_data_func=None, extra_args_provider=None, args_defaults=None):
    initialize_megatron(extra_args_provider, args_defaults)
    args = get_args()
    model = [model_provider(pre_process=True, post_process=True)]
    optimizer = torch.optim.Adam(model[0].parameters(), lr=args.lr)
    args.iteration = load_checkpoint(model, optimizer)
    args.consumed_train_samples = args.iteration * args.global_batch_size
    train_ds, _, _ = train_valid_test_dataset_provider([args.train_iters * args.global_batch_size, 0, 0])
    loader = torch.utils.data.DataLoader(train_ds, batch_size=args.micro_batch_size)
    data_iterator = iter(loader)
    iteration, _ = train(forward_step_func, model, optimizer, None, data_iterator, None, None, None, None, None)
    if args.save:
        save_checkpoint(iteration, model, optimizer)
    dist.barrier()
    writer = get_tensorboard_writer()
    if writer:
        writer.flush()
        writer.close()


def train_step(forward_step_func, data_iterator, model, optimizer, opt_param_scheduler, config,
               forward_backward_func=None, iteration=None):
    args = get_args()
    timers = get_timers()
    dp_size = parallel_state.get_data_parallel_world_size()
    num_microbatches = args.global_batch_size // (args.micro_batch_size * dp_size)
    timers("forward-backward", log_level=1).start()
    losses = []
    for _ in range(num_microbatches):
        output, loss_func = forward_step_func(data_iterator, model[0])
        result = loss_func(output)
        loss, loss_reduced = result[0], result[-1]
        (loss / num_microbatches).backward()
        losses.append(loss_reduced)
    timers("forward-backward").stop()
    timers("optimizer", log_level=1).start()
    if dp_size > 1:
        for param in model[0].parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad, group=parallel_state.get_data_parallel_group())
                param.grad /= dp_size
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    timers("optimizer").stop()
    loss_dict = {key: sum(d[key] for d in losses) / len(losses) for key in losses[0]}
    return loss_dict, 0, False, False, 0, None, None, None


def training_log(loss_dict, total_loss_dict, learning_rate, iteration, loss_scale, report_memory_flag,
                 skipped_iter, grad_norm, params_norm, num_zeros_in_grad, max_attention_logit=None,
                 pg_collection=None, is_first_iteration=False):
    args = get_args()
    timers = get_timers()
    writer = get_tensorboard_writer()
    if writer:
        for key, value in loss_dict.items():
            writer.add_scalar(key, float(value), iteration)
    if iteration % args.log_interval == 0:
        timers_to_log = ["forward-backward", "optimizer"]
        if args.log_timers_to_tensorboard:
            timers.write(timers_to_log, writer, iteration, normalizer=args.log_interval, reset=False)
        timers.log(timers_to_log, normalizer=args.log_interval)
        if dist.get_rank() == dist.get_world_size() - 1:
            text = " | ".join(f"{k}: {float(v):.6E}" for k, v in loss_dict.items())
            print(f" iteration {iteration:8d}/{args.train_iters:8d} | {text} |", flush=True)
    return report_memory_flag


def train(forward_step_func, model, optimizer, opt_param_scheduler, train_data_iterator, valid_data_iterator,
          process_non_loss_data_func, config, checkpointing_context, non_loss_data_func):
    args = get_args()
    for module in model:
        module.train()
    total_loss_dict = {}
    iteration = args.iteration
    report_memory_flag = True
    while iteration < args.train_iters:
        args.curr_iteration = iteration
        loss_dict, skipped_iter, should_checkpoint, should_exit, exit_code, grad_norm, num_zeros_in_grad, _ = (
            train_step(forward_step_func, train_data_iterator, model, optimizer, opt_param_scheduler, config,
                       iteration=iteration))
        iteration += 1
        args.consumed_train_samples += args.global_batch_size
        report_memory_flag = training_log(loss_dict, total_loss_dict, args.lr, iteration, 1.0, report_memory_flag,
                                          skipped_iter, grad_norm, None, num_zeros_in_grad, None)
        if args.save and args.save_interval and iteration % args.save_interval == 0:
            save_checkpoint(iteration, model, optimizer)
    return iteration, 0
