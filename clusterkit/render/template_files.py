"""The templates a job is rendered from, as input: the ops folders (``--template-dir``,
$CLUSTERKIT_TEMPLATES), the recipe's folder and the built-ins. Whatever goes wrong reading or
rendering one (a syntax error, an undefined name, ``1/0``, a file that is no text, an include of
itself) is one line naming the template file and line, as a compiler says it:
``ops/job.sbatch.j2:3: template: 'nosuch' is undefined``."""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

import jinja2

from clusterkit.errors import ClusterkitError, TemplateError


def checked_directories(dirs: tuple[str, ...]) -> None:
    """Each ops template directory exists and is one: a misspelt one would silently leave the
    built-ins in force."""
    for directory in dirs:
        if not os.path.isdir(directory):
            problem = "not a directory" if os.path.lexists(directory) else "no such directory"
            raise TemplateError(f"{directory}: template directory: {problem}")


class TemplateFiles(jinja2.FileSystemLoader):
    """Jinja's file loader, with a template file it cannot read named with what is wrong."""

    def get_source(self, environment: jinja2.Environment, template: str) -> tuple[str, str, Any]:
        try:
            return super().get_source(environment, template)
        except jinja2.TemplateNotFound:  # an OSError to Jinja: said by render_template, where it is included
            raise
        except UnicodeDecodeError as exc:
            problem = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
        except OSError as exc:  # found a moment ago, unreadable now
            problem = exc.strerror or str(exc)
        raise TemplateError(f"{self._file_of(template)}: template: {problem}") from None

    def _file_of(self, template: str) -> str:
        found = (os.path.join(folder, *template.split("/")) for folder in self.searchpath)
        return next((path for path in found if os.path.isfile(path)), template)


def render_template(env: jinja2.Environment, name: str, context: dict[str, Any]) -> str:
    """The template ``name`` rendered; any failure of a template is a :class:`TemplateError` at the
    innermost template line Jinja's traceback names (an error of clusterkit's own, such as a value
    that cannot be quoted, stays what it is)."""
    searched = tuple(env.loader.searchpath)  # type: ignore[union-attr]
    try:
        return env.get_template(name).render(context)
    except ClusterkitError:
        raise
    except jinja2.TemplateSyntaxError as exc:  # its own file and line, whichever template included it
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else _where(exc.__traceback__, searched, name)
        message = exc.message or "syntax error"
    except Exception as exc:
        where, message = _where(exc.__traceback__, searched, name), _message(exc, searched)
    raise TemplateError(f"{where}: template: {message}") from None


def checked_script(env: jinja2.Environment, name: str, script: str) -> str:
    """The job script template ``name`` rendered as ``script``, if sbatch would take it."""
    lines = script.lstrip("\n").splitlines()
    if not script.strip():
        raise TemplateError(f"{env.get_template(name).filename}: template: renders an empty job script")
    if not script.startswith("#!"):
        raise TemplateError(
            f"{env.get_template(name).filename}: template: the job script must start with #! "
            f"(sbatch takes no other), not '{lines[0][:60]}'"
        )
    return script


def _message(exc: Exception, searched: tuple[str, ...]) -> str:
    if isinstance(exc, jinja2.TemplateNotFound):  # an include or extends of a name no directory holds
        return f"{', '.join(map(str, exc.templates))} is in none of the template directories ({', '.join(searched)})"
    if isinstance(exc, RecursionError):
        return "includes itself, directly or through others, without end"
    if isinstance(exc, jinja2.TemplateError):  # UndefinedError and the like
        return exc.message or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"  # what an expression raised while rendering (1/0, int('x'))


def _where(trace: TracebackType | None, searched: tuple[str, ...], name: str) -> str:
    """``file:line`` of the innermost template frame (Jinja rewrites its traceback so that a
    template's frames carry the template file and line); the template's name when there is none."""
    where = name
    folders = tuple(os.path.join(folder, "") for folder in searched)
    while trace is not None:
        file = trace.tb_frame.f_code.co_filename
        if file.startswith(folders) and not file.endswith(".py"):
            where = f"{file}:{trace.tb_lineno}"
        trace = trace.tb_next
    return where
