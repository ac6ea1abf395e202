"""Who acts when an operator control runs from a terminal, and the part of
`manage.py queue` and `manage.py connector` that acts (jobs.controls)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.services import Actor
from core.errors import ApplicationError
from jobs.controls import OperatorControl


def operator_acting(username: str | None) -> tuple[Any, Actor]:
    """The user a command's `--as` names and the actor its audit entries name: that
    operator, or the system's `cli` when none is named. CommandError for a name that is
    no user."""
    if not username:
        return None, Actor.system("cli")
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"no user {username!r}")
    return user, Actor.operator(user)


class OperatorControlCommand(BaseCommand):
    """`manage.py <thing> <verb>|status [NAME] [--reason TEXT] [--as USER] [--json]`:
    either action of `control` as the operator `--as` names; `status` is the
    subclass's own (`_status`)."""

    control: ClassVar[OperatorControl]
    argument: ClassVar[str]  # the positional's name, kept as each command had it

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = self.control.verbs
        parser.add_argument("action", choices=[*verbs, "status"])
        parser.add_argument(
            self.argument, nargs="?", help=f"the {self.control.thing} (status: all when omitted)"
        )
        parser.add_argument("--reason", default="", help=f"the justification ({', '.join(verbs)})")
        parser.add_argument("--as", dest="username", help="the operator acting")
        parser.add_argument("--json", action="store_true", help="status as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        verb, name = options["action"], options[self.argument]
        if verb == "status":
            self._status(name, as_json=options["json"])
            return
        if not name:
            raise CommandError(f"{self.control.thing} {verb} needs a {self.argument.upper()}")
        user, actor = operator_acting(options["username"])
        action = self.control.action(verb)  # argparse let only the control's verbs through
        try:
            changed = action.run(name=name, reason=options["reason"], actor=actor, user=user)
        except ApplicationError as exc:
            raise CommandError(exc.one_line()) from exc
        said = action.done if changed else f"was already {action.already}"
        self.stdout.write(f"{name} {said}")

    def _status(self, name: str | None, *, as_json: bool) -> None:
        raise NotImplementedError
