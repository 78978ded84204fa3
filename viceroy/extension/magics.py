"""``%mesh`` / ``%%mesh`` and the ipyparallel-style aliases ``%px``, ``%%px``, ``%autopx``.

%mesh up gpus=4            start a local mesh (any NAME=SIZE dims); binds `mesh`
    [--preload MOD,MOD|none] [--backend gloo|nccl] [--torch-dist] [--env NAME=VALUE]...
    [--output-limit BYTES]
%%mesh [--where gpus=0:2] [--ranks 0,3] [--no-fail-fast] [--timeout S]
                           run the cell on the ranks, output streamed live
%mesh status | down | restart [--failed] | interrupt | logs RANK | stacks
%mesh push lr=0.1 | pull t | scatter part=data | gather part | auto on|off
%mesh up hosts=2 gpus=8 --launcher ssh --hostfile F | --launcher slurm | --launcher attach --listen A
%mesh sync [DIR] [--to PATH] [--dry-run]   copy DIR to every host of an ssh mesh (rsync)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class, no_var_expand

from viceroy.extension.args import Command, RunOptions, parse_command, parse_run_options
from viceroy.extension.args import split_line_code as _split_line_code
from viceroy.extension.errors import render_mesh_error
from viceroy.extension.launching import sync_report
from viceroy.extension.output import format_rank_set
from viceroy.extension.session import MeshSession, describe_dims
from viceroy.extension.terminal import terminal_line
from viceroy.runtime.shape import describe_ranks

HELP = """\
%mesh up DIM=SIZE... [--launcher local|ssh|slurm|attach] [--hostfile FILE] [--listen ADDR]
    [--key-file FILE] [--backend gloo|nccl] [--torch-dist] [--preload MOD,MOD|none]
    [--env NAME=VALUE]...          start a mesh (gpus=4, hosts=2 gpus=8, dp=2 tp=2); binds `mesh`
    [--output-limit BYTES]         output shown per rank per call (default 1 MiB; the rest dropped)
    ssh:   [--identity KEYFILE] [--ssh-port N] [--ssh-options="-o ProxyJump=gw ..."]
    slurm: [--salloc-options="-p gpu -t 60 --gpus-per-node=8"] [--srun-options="..."]
           [--agents-per-node N]   (outside an allocation, salloc is asked for nodes and tasks only)
%mesh status | down | interrupt | stacks
%mesh restart [--failed]           every rank (their state is lost), or only the dead ones
%mesh logs RANK [--tail N]         a rank's recent output
%mesh push NAME=EXPR... | pull NAME... | scatter NAME=EXPR... | gather NAME...
                                   EXPR: any Python expression, evaluated here (x=1 + 2, lr=0.1 * 2);
                                   items split at spaces or commas (a tuple needs parentheses);
                                   a bare NAME sends that variable
%mesh auto on|off                  run every following cell on the ranks (%autopx toggles it)
%mesh sync [DIR] [--to PATH] [--dry-run]   copy DIR to every host of an ssh mesh (rsync)
%%mesh [--where DIM=A:B] [--ranks 0,3] [--no-fail-fast] [--timeout S]
                                   the cell runs on the ranks; output streams live
%px [OPTIONS] [--] CODE · %%px · %autopx   the same, as in ipyparallel (`--` ends the options)"""


def _closed_mesh_guard(fn: Any) -> Any:
    """Turn runtime errors that mean "you asked for something impossible" into one line."""

    def wrapper(self: MeshMagics, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except UsageError:
            raise
        except Exception as e:
            if hasattr(e, "_render_traceback_"):  # rendered already (by the subcommand)
                raise
            if hasattr(e, "failures"):
                raise render_mesh_error(e) from None
            if type(e).__name__ == "MeshClosedError":
                raise UsageError(str(e)) from None  # it says when, and to start one with %mesh up
            raise

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


@magics_class
class MeshMagics(Magics):
    """The notebook's handle on its mesh; all state lives in a `MeshSession`."""

    def __init__(self, shell: Any, session: MeshSession) -> None:
        super().__init__(shell)
        self.session = session

    # --- %mesh / %%mesh ----------------------------------------------------------------------

    @no_var_expand
    @line_cell_magic
    @_closed_mesh_guard
    def mesh(self, line: str, cell: str | None = None) -> Any:
        """Drive the mesh.

        Line: ``%mesh up gpus=4`` · ``down`` · ``status`` · ``restart [--failed]`` ·
        ``interrupt`` · ``logs RANK [--tail N]`` · ``stacks`` · ``push NAME=EXPR ...`` ·
        ``pull NAME ...`` · ``scatter NAME=EXPR ...`` · ``gather NAME ...`` · ``auto on|off`` ·
        ``sync [DIR] [--to PATH]``. ``%mesh --help`` lists every command with its options.

        Cell: ``%%mesh [--where DIM=A:B] [--ranks 0,3] [--no-fail-fast] [--timeout S]`` runs
        the cell on the ranks, streams their output, and returns the ranks' values of the
        trailing expression as a ValueMesh.
        """
        if cell is not None:
            return self._run(cell, parse_run_options(line, "%%mesh", self._mesh_ranks()), "%%mesh")
        cmd = parse_command(line)
        return getattr(self, f"_cmd_{cmd.name}")(cmd)

    @no_var_expand
    @line_cell_magic
    @_closed_mesh_guard
    def px(self, line: str, cell: str | None = None) -> Any:
        """ipyparallel habit: ``%px CODE`` / ``%%px`` run code on the ranks (same options; on the
        line, ``--`` ends them: ``%px --ranks 0 -- CODE``)."""
        if cell is None:
            opts, code = _split_line_code(line, "%px", self._mesh_ranks())
            return self._run(code, opts, "%px")
        return self._run(cell, parse_run_options(line, "%%px", self._mesh_ranks()), "%%px")

    @line_magic
    def autopx(self, line: str) -> None:
        """ipyparallel habit: toggle running every cell on the ranks (``%mesh auto on|off``)."""
        if line.strip():
            raise UsageError("%autopx takes no arguments; it toggles auto mode")
        self._cmd_auto(Command("auto", on=not self.session.auto))

    def _mesh_ranks(self) -> Sequence[int] | None:
        """The running mesh's ranks, which ``--ranks`` is checked against as it is read (a
        range far past them is refused before it is expanded); None with no mesh up."""
        mesh = self.session.mesh
        return None if mesh is None else mesh.ranks

    def _run(self, code: str, opts: RunOptions, label: str) -> Any:
        if not code.strip():
            return None
        return self.session.run_cell(code, opts, label=label)

    # --- subcommands -------------------------------------------------------------------------

    def _cmd_up(self, cmd: Command) -> None:
        mesh = self.session.up(
            cmd.dims,
            launcher=cmd.launcher,
            backend=cmd.backend,
            preload=cmd.preload,
            hostfile=cmd.hostfile,
            listen=cmd.listen,
            key_file=cmd.key_file,
            torch_dist=cmd.torch_dist,
            env=cmd.env,
            output_limit=cmd.output_limit,
            launcher_options=cmd.launcher_options,
        )
        n = mesh.size()
        print(f"mesh up: {describe_dims(mesh.dims)} ({n} rank{'s' if n != 1 else ''}); `mesh` is bound to it")
        self.show_view()

    def _cmd_help(self, cmd: Command) -> None:
        print(HELP)

    def _cmd_sync(self, cmd: Command) -> None:
        print(sync_report(cmd.sync_src, self.session.sync(cmd.sync_src, cmd.sync_dest, cmd.dry_run)))

    def _cmd_down(self, cmd: Command) -> None:
        stopped = self.session.down()
        note = ""
        if self.session.auto:  # with no mesh, auto mode would only fail every plain cell
            self.session.auto = False
            note = "; auto mode is off: cells run here again"
        print(("mesh stopped" if stopped else "no mesh was up") + note)

    def _cmd_status(self, cmd: Command) -> None:
        print(self.status_text())
        if self.session.mesh is not None:
            self.show_view()

    def show_view(self) -> None:
        """Display the live mesh view in the current cell (static HTML without anywidget)."""
        from IPython.display import display

        from viceroy.extension.widget import view

        display(view(self.session))

    def status_text(self) -> str:
        """``mesh gpus=4: ranks 0-1 idle, rank 2 error (ZeroDivisionError: ...), rank 3 dead
        (SIGKILL)``; ranks whose last call returned count as idle."""
        snap = self.session.state.snapshot()
        auto = "\nauto on: cells run on the ranks (`%mesh auto off` to stop)" if snap["auto"] else ""
        if snap["dims"] is None:
            if snap["auto"]:
                auto = "\nauto on: plain cells are sent to the ranks, and fail while no mesh is up (`%mesh auto off` runs them here)"
            return "no mesh is up; start one with `%mesh up gpus=4`" + auto
        groups: dict[str, list[int]] = {}
        for r in snap["ranks"]:
            key = "idle" if r["state"] == "done" else r["state"]
            if r["state"] == "dead" and r["exit"]:
                key += f" ({r['exit']})"
            elif r["state"] == "error" and r["error"]:
                key += f" ({r['error']})"
            groups.setdefault(key, []).append(r["rank"])
        parts = [
            f"{'rank' if len(rs) == 1 else 'ranks'} {format_rank_set(rs)} {key}"
            for key, rs in groups.items()
        ]
        text = f"mesh {describe_dims(snap['dims'])}: " + ", ".join(parts)
        if any(r["state"] == "dead" for r in snap["ranks"]):
            text += "\n`%mesh restart --failed` brings back only the dead ranks"
        return text + auto

    def _cmd_restart(self, cmd: Command) -> None:
        ranks = self.session.restart(failed_only=cmd.failed_only)
        if ranks:
            print(f"restarted {'rank' if len(ranks) == 1 else 'ranks'} {format_rank_set(ranks)}")
        else:
            print("no rank had died: nothing restarted (`%mesh restart` restarts every rank)")
        print(self.status_text())

    def _cmd_interrupt(self, cmd: Command) -> None:
        mesh = self.session.require()
        mesh.interrupt()
        still = [r for r, state in mesh.states().items() if state == "running"]
        if not still:
            print(f"interrupted whatever was running on ranks {format_rank_set(mesh.ranks)}")
            return
        who = f"rank{'s' if len(still) > 1 else ''} {format_rank_set(still)}"
        print(f"interrupted ranks {format_rank_set(mesh.ranks)}, but {who} did not stop (in native code, or deaf "
              f"to interrupts): running until they finish; `%mesh restart` ends them (their state is lost)")

    def _cmd_logs(self, cmd: Command) -> None:
        mesh = self.session.require()
        assert cmd.rank is not None
        if cmd.rank not in mesh.ranks:
            raise UsageError(
                f"%mesh logs: no rank {cmd.rank}; this mesh has ranks {format_rank_set(mesh.ranks)}"
            )
        text = mesh.logs(cmd.rank, tail=cmd.tail)
        if not text.strip():
            print(f"(rank {cmd.rank} has written nothing yet)")
            return
        # progress bars drawn with \r show their final state, as a terminal would
        print("\n".join(terminal_line(line) for line in text.rstrip("\n").split("\n")))

    def _cmd_stacks(self, cmd: Command) -> None:
        stacks = self.session.require().stacks()
        groups: dict[str, list[int]] = {}
        for r, text in stacks.by_rank().items():
            groups.setdefault(str(text).rstrip(), []).append(r)
        for text, ranks in groups.items():
            label = "rank" if len(ranks) == 1 else "ranks"
            print(f"--- {label} {format_rank_set(ranks)} ---\n{text}")

    def _evaluate(self, cmd: Command) -> dict[str, Any]:
        """The values of a push or scatter's NAME=EXPRESSION items, evaluated here."""
        shell = self.shell
        assert shell is not None
        values: dict[str, Any] = {}
        for name, expr in cmd.assignments:
            try:
                values[name] = eval(expr, shell.user_global_ns, shell.user_ns)
            except NameError as e:
                if expr != name:  # NAME=EXPRESSION
                    raise UsageError(
                        f"%mesh {cmd.name}: cannot evaluate {name}={expr} here: NameError: {e}"
                    ) from None
                raise UsageError(  # a bare NAME: send that variable
                    f"%mesh {cmd.name}: there is no variable {name!r} here on the controller to "
                    f"send; define it first, or give a value: `%mesh {cmd.name} {name}=...`"
                ) from None
            except Exception as e:
                raise UsageError(
                    f"%mesh {cmd.name}: cannot evaluate {name}={expr} here: {type(e).__name__}: {e}"
                ) from None
        return values

    def _cmd_push(self, cmd: Command) -> None:
        mesh = self.session.require()
        values = self._evaluate(cmd)
        try:
            mesh.push(**values)
        except (TypeError, ValueError) as e:  # cannot be pickled; a handle of another mesh
            raise UsageError(f"%mesh push: {e}") from None
        print(f"pushed {', '.join(values)} to ranks {format_rank_set(mesh.ranks)}")

    def _cmd_scatter(self, cmd: Command) -> None:
        """Each value split over the ranks: a list or tuple gives one item per rank, an array
        or tensor is cut along its first axis."""
        mesh = self.session.require()
        for name, value in self._evaluate(cmd).items():
            try:
                mesh.scatter(name, value)
            except (TypeError, ValueError) as e:
                raise UsageError(f"%mesh scatter: {e}") from None
        print(f"scattered {', '.join(n for n, _ in cmd.assignments)} over ranks {format_rank_set(mesh.ranks)}")

    def _cmd_pull(self, cmd: Command) -> Any:
        mesh = self.session.require()
        return self._read(cmd, mesh.pull)

    def _cmd_gather(self, cmd: Command) -> Any:
        """Every rank's value joined in rank order (arrays and tensors concatenated, lists
        chained)."""
        mesh = self.session.require()
        return self._read(cmd, mesh.gather)  # other errors say "gather NAME failed"

    def _read(self, cmd: Command, read: Any) -> Any:
        """Each name of a pull or gather read; a name some ranks lack is one line naming them."""
        got = {}
        for name in cmd.names:
            try:
                got[name] = read(name)
            except Exception as e:
                failures = getattr(e, "failures", None)
                if not failures or any(f.exc_type != "NameError" for f in failures.values()):
                    raise
                ranks = sorted(failures)
                verb = "has" if len(ranks) == 1 else "have"
                raise UsageError(
                    f"%mesh {cmd.name}: {describe_ranks(ranks)} {verb} no variable {name!r}"
                ) from None
        return got[cmd.names[0]] if len(got) == 1 else got

    def _cmd_auto(self, cmd: Command) -> None:
        if cmd.on:
            self.session.require()
        self.session.auto = bool(cmd.on)
        print(
            "auto on: every cell now runs on the ranks; cells starting with a %magic run here. "
            "`%mesh auto off` to stop"
            if cmd.on
            else "auto off: cells run on the controller again"
        )


def auto_transformer(session: MeshSession) -> Any:
    """An input transformer that, in auto mode, turns a plain cell into a ``%%mesh`` cell."""

    def transform(lines: list[str]) -> list[str]:
        if not session.auto:
            return lines
        first = next((ln for ln in lines if ln.strip()), None)
        if first is None or first.lstrip().startswith(("%", "!")):
            return lines
        return ["%%mesh\n", *lines]

    transform.has_side_effects = True  # type: ignore[attr-defined]  # skip in is_complete checks
    return transform
