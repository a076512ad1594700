"""On/off switches read from the environment, all read the same way.

A switch is unset (or empty), on (`1`, `true`, `yes`, `on`) or off (`0`, `false`, `no`, `off`),
in any case. Anything else is refused with one line naming the variable and the values it
takes: `SCRATCHLM_NO_KERNELS=no` must not turn the kernels off, and `SCRATCHLM_CPU_BF16=maybe`
must not be ignored without a word. The command line checks every switch before a command
starts (`check_switches`), so a typo costs nothing; the library reads them with `env_switch`.
"""

from __future__ import annotations

import os

from scratchlm.errors import UserError

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")

SWITCHES = {
    "SCRATCHLM_NO_KERNELS": "1: leave the compiled CPU kernels out and use PyTorch's operations",
    "SCRATCHLM_CPU_BF16": "0: act as a CPU without bfloat16 units; 1: claim them",
}
"""Every on/off variable scratchlm reads, with what setting it does."""


def env_switch(name: str) -> bool | None:
    """True or False for a switch that is set, None for one unset or empty; a UserError for any
    other value."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return None
    if value in ON:
        return True
    if value in OFF:
        return False
    what = SWITCHES.get(name, "")
    raise UserError(f"{name}={raw!r} is not a switch: set it to 1 or 0 (true/false, yes/no and on/off are read "
                    f"the same way), or unset it{f' ({what})' if what else ''}")


def check_switches() -> None:
    """Refuse, before any work, a switch in SWITCHES set to something it does not take, and a
    stated CPU clock (SCRATCHLM_CPU_MAX_GHZ, read by scratchlm.machine.cpu.max_clock_ghz) that is not a
    sane number of GHz."""
    for name in SWITCHES:
        env_switch(name)
    stated_clock_ghz()


def stated_clock_ghz() -> float | None:
    """The CPU's highest clock in GHz as SCRATCHLM_CPU_MAX_GHZ states it (scratchlm.machine.cpu's bound
    for MFU), None where it is unset or empty; a UserError for anything but a number in 0.1..20."""
    raw = os.environ.get("SCRATCHLM_CPU_MAX_GHZ", "").strip()
    if not raw:
        return None
    try:
        ghz = float(raw)
    except ValueError:
        ghz = float("nan")
    if not 0.1 <= ghz <= 20:  # also refuses nan and inf
        raise UserError(f"SCRATCHLM_CPU_MAX_GHZ={raw!r}: give the CPU's highest clock in GHz, a number such as 3.5")
    return ghz
