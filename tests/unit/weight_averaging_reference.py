"""Reference values for weight_averaging_tests.cpp, computed by the venv's torch and Lightning.

  ema <in> <out> <decay> <every> <start_step|None>  AveragedModel(avg_fn=get_ema_avg_fn(decay), use_buffers=True)
      over the steps Lightning's EMAWeightAveraging.should_update picks
  swa <in> <out>                                   AveragedModel() (equal weights) over every step given
  swalr <out> <lr,lr> <swa_lr,swa_lr> <strategy:anneal_epochs,...> <swa_start> <epochs>
      for each (cos|linear, anneal_epochs), the lr of each group during each epoch, SWALR made as
      Lightning's StochasticWeightAveraging makes it
  update_bn <in> <out>                              torch.optim.swa_utils.update_bn of a Linear-BatchNorm1d-Linear
Several commands run in one process when separated by "+".
<in>: {"step_<k>": {"p:<name>" | "b:<name>": tensor}, ...} (k = the global step after which it was taken);
<out>: {name: tensor} (torch.save), or text lines for swalr.
"""
import pathlib
import sys

import torch
from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_avg_fn, update_bn


def module_of(tensors):
    """A module whose parameters, then buffers, are these tensors, in this order."""
    m = torch.nn.Module()
    for key, value in tensors.items():
        kind, name = key.split(":", 1)
        if kind == "p":
            m.register_parameter(name.replace(".", "__"), torch.nn.Parameter(value.clone()))
        else:
            m.register_buffer(name.replace(".", "__"), value.clone())
    return m


def load_into(m, tensors):
    with torch.no_grad():
        for key, value in tensors.items():
            getattr(m, key.split(":", 1)[1].replace(".", "__")).copy_(value)


def averaged(average, tensors):
    state = average.module.state_dict()
    return {key.split(":", 1)[1]: state[key.split(":", 1)[1].replace(".", "__")] for key in tensors}


def steps(path):
    data = torch.load(path)
    return sorted(((int(k.split("_")[1]), v) for k, v in data.items()), key=lambda kv: kv[0])


def lightning_ema_rule(every, start):
    """Lightning's EMAWeightAveraging.should_update, taken from its source file: importing Lightning
    costs seconds this test does not need."""
    import ast
    import importlib.util
    import types

    path = pathlib.Path(importlib.util.find_spec("lightning").origin).parent / "pytorch/callbacks/weight_averaging.py"
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EMAWeightAveraging")
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "should_update")
    method.returns = None
    for a in method.args.args + method.args.kwonlyargs:
        a.annotation = None
    namespace = {}
    exec(compile(ast.Module(body=[method], type_ignores=[]), str(path), "exec"), namespace)
    rule = types.SimpleNamespace(update_every_n_steps=every, update_starting_at_step=start,
                                 update_starting_at_epoch=None)
    rule.should_update = types.MethodType(namespace["should_update"], rule)
    return rule


def main(argv):
    if "+" in argv:  # several commands in one process: "cmd args + cmd args"
        i = argv.index("+")
        main(argv[:i])
        main([argv[0]] + argv[i + 1:])
        return
    command = argv[1]
    if command == "ema":
        seq = steps(argv[2])
        decay, every = float(argv[4]), int(argv[5])
        start = None if argv[6] == "None" else int(argv[6])
        rule = lightning_ema_rule(every, start)
        model = module_of(seq[0][1])
        average = AveragedModel(model, avg_fn=get_ema_avg_fn(decay), use_buffers=True)
        updates = 0
        for step, tensors in seq:
            if rule.should_update(step_idx=step - 1):
                load_into(model, tensors)
                average.update_parameters(model)
                updates += 1
        out = averaged(average, seq[0][1])
        out["n_averaged"] = torch.tensor(updates)
        torch.save(out, argv[3])
    elif command == "swa":
        seq = steps(argv[2])
        model = module_of(seq[0][1])
        average = AveragedModel(model)
        for _, tensors in seq:
            load_into(model, tensors)
            average.update_parameters(model)
        torch.save(averaged(average, seq[0][1]), argv[3])
    elif command == "swalr":
        lrs = [float(v) for v in argv[3].split(",")]
        swa_lrs = [float(v) for v in argv[4].split(",")]
        swa_start, epochs = int(argv[6]), int(argv[7])
        with open(argv[2], "w") as out:
            for config in argv[5].split(","):
                strategy, anneal_epochs = config.split(":")[0], int(config.split(":")[1])
                params = [torch.nn.Parameter(torch.zeros(1)) for _ in lrs]
                optimizer = torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)])
                scheduler = None
                for epoch in range(epochs):
                    if epoch == swa_start:  # Lightning's on_train_epoch_start
                        for lr, group in zip(swa_lrs, optimizer.param_groups):
                            group["initial_lr"] = lr
                        scheduler = SWALR(optimizer, swa_lr=swa_lrs, anneal_epochs=anneal_epochs,
                                          anneal_strategy=strategy, last_epoch=epochs if strategy == "cos" else -1)
                    for i, group in enumerate(optimizer.param_groups):
                        out.write(f"{config} {epoch} {i} {group['lr']!r}\n")
                    optimizer.step()
                    if scheduler is not None:
                        scheduler.step()  # the epoch's end
    elif command == "update_bn":
        data = torch.load(argv[2])
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                  torch.nn.Linear(16, 3))
        with torch.no_grad():
            for name, value in data["weights"].items():
                net.get_parameter(name).copy_(value)
        net[1].running_mean.fill_(5.0)  # update_bn must reset what was there
        update_bn([batch for batch in data["batches"]], net)
        torch.save({"running_mean": net[1].running_mean, "running_var": net[1].running_var,
                    "num_batches_tracked": net[1].num_batches_tracked}, argv[3])
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(sys.argv)
