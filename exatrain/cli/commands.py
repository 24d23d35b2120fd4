"""Where each subcommand's function lives: one module per group of `exatrain --help` (main.COMMAND_GROUPS).

`exatrain NAME` runs `cmd_NAME(args, extra)` of the module of its group."""

from exatrain.cli.data_commands import cmd_checkpoint, cmd_data  # noqa: F401
from exatrain.cli.inspect_commands import (  # noqa: F401
    cmd_config,
    cmd_doctor,
    cmd_dump,
    cmd_env,
    cmd_plan,
    cmd_report,
    cmd_scale,
)
from exatrain.cli.job_commands import (  # noqa: F401
    cmd_cancel,
    cmd_container,
    cmd_cost,
    cmd_monitor,
    cmd_sbatch,
    cmd_status,
    cmd_submit,
)
from exatrain.cli.run_commands import cmd_run, cmd_train  # noqa: F401
