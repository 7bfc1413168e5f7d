"""Lightning's GradientAccumulationScheduler and BackboneFinetuning, driven on a tiny module, for
tests/unit/finetuning_tests.cpp. Writes "<case> <key> <value>" lines (messages: "<case> message <text>")."""
import logging
import sys
import warnings

import torch
from lightning.pytorch.callbacks import BackboneFinetuning, GradientAccumulationScheduler

warnings.filterwarnings("ignore")
out_path = sys.argv[-1]
lines = []

# The accumulation factor of each epoch, and the checks' messages.
for name, scheduling in {"sched_a": {1: 2, 3: 4}, "sched_b": {2: 3}, "sched_c": {0: 5, 2: 1}}.items():
    cb = GradientAccumulationScheduler(dict(scheduling))
    for epoch in range(6):
        lines.append(f"{name} {epoch} {cb.get_accumulate_grad_batches(epoch)}")
for name, scheduling in {"bad_epoch": {-1: 2, 3: 4}, "bad_factor": {1: 0, 3: 4}}.items():
    try:
        GradientAccumulationScheduler(scheduling)
    except Exception as e:
        lines.append(f"{name} message {e}")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU())
        self.head = torch.nn.Linear(8, 2)


# The lrs of each epoch: group 0 (the head) and the backbone's group, as on_train_epoch_start leaves them.
CASES = {  # name: (options, main lr per epoch, epochs)
    "bb_default": (dict(unfreeze_backbone_at_epoch=2), lambda e: 0.1, 8),
    "bb_custom": (dict(unfreeze_backbone_at_epoch=1, lambda_func=lambda e: 1.0 + 0.1 * e, backbone_initial_lr=0.003,
                       should_align=False), lambda e: 0.05 * 0.9 ** e, 7),
    "bb_align": (dict(unfreeze_backbone_at_epoch=0, backbone_initial_ratio_lr=0.3, lambda_func=lambda e: 1.7),
                 lambda e: 0.2 * 0.8 ** e, 6),
}
for name, (options, main_lr, epochs) in CASES.items():
    net = Net()
    cb = BackboneFinetuning(**options)
    cb.freeze_before_training(net)
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=main_lr(0))
    for epoch in range(epochs):
        opt.param_groups[0]["lr"] = main_lr(epoch)  # as a scheduler would have left it
        cb.finetune_function(net, epoch, opt)
        lines.append(f"{name} main{epoch} {main_lr(epoch)!r}")
        lines.append(f"{name} groups{epoch} {len(opt.param_groups)}")
        lines.append(f"{name} lr{epoch} {opt.param_groups[-1]['lr']!r}")

# BackboneFinetuning with an lr scheduler made in configure_optimizers (one group then): Lightning's order,
# the callback's finetune_function at each epoch start (the backbone's group added at the unfreeze), the
# scheduler stepped after each optimizer step ("step", 2 batches an epoch) or at each epoch end. Every
# group's lr at each epoch start, before the callback (the scheduler's) and after; where PyTorch's
# scheduler raises, the epoch.
S = torch.optim.lr_scheduler
SCHEDULED = {  # name: (options, scheduler, interval, epochs)
    "bbs_step": (dict(unfreeze_backbone_at_epoch=2), lambda o: S.StepLR(o, step_size=2, gamma=0.5), "epoch", 8),
    "bbs_cosine": (dict(unfreeze_backbone_at_epoch=3, lambda_func=lambda e: 1.5),
                   lambda o: S.CosineAnnealingLR(o, T_max=8, eta_min=0.001), "epoch", 8),
    "bbs_exp_steps": (dict(unfreeze_backbone_at_epoch=1, should_align=False),
                      lambda o: S.ExponentialLR(o, gamma=0.9), "step", 5),
    "bbs_lambda": (dict(unfreeze_backbone_at_epoch=2), lambda o: S.LambdaLR(o, lambda e: 0.9 ** e), "epoch", 6),
}
for name, (options, make, interval, epochs) in SCHEDULED.items():
    net = Net()
    cb = BackboneFinetuning(**options)
    cb.freeze_before_training(net)
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    sched = make(opt)
    try:
        for epoch in range(epochs):
            lines.append(f"{name} pre{epoch} " + " ".join(repr(g["lr"]) for g in opt.param_groups))
            cb.finetune_function(net, epoch, opt)
            lines.append(f"{name} lrs{epoch} " + " ".join(repr(g["lr"]) for g in opt.param_groups))
            for _ in range(2 if interval == "step" else 0):
                sched.step()
            if interval == "epoch":
                sched.step()
    except Exception as e:
        lines.append(f"{name} raised {epoch} {type(e).__name__}: {e}")

# Lightning's verbose lines (its module logger), on bb_custom's schedule with verbose and rounding 5.
class Lines(logging.Handler):
    def emit(self, record):
        lines.append(f"bb_verbose line{len([l for l in lines if l.startswith('bb_verbose line')])} {record.getMessage()}")


finetuning_log = logging.getLogger("lightning.pytorch.callbacks.finetuning")
finetuning_log.setLevel(logging.INFO)
finetuning_log.addHandler(Lines())
finetuning_log.propagate = False
options, main_lr, epochs = CASES["bb_custom"]
net = Net()
cb = BackboneFinetuning(**options, verbose=True, rounding=5)
cb.freeze_before_training(net)
opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=main_lr(0))
for epoch in range(epochs):
    opt.param_groups[0]["lr"] = main_lr(epoch)
    cb.finetune_function(net, epoch, opt)

with open(out_path, "w") as f:
    f.write("\n".join(lines) + "\n")
