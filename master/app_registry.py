"""The applications a master knows, found by id or by one of their containers' ids, and
forgotten once they ended long enough ago (call every method with the master's lock)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from weir.master.application import Application
from weir.master.errors import InvalidArgument, NotFound, shown
from weir.master.physical_plan import PTContainer

__all__ = ["AppRegistry"]

_LOGGER = logging.getLogger("weir.master.core")


class AppRegistry:
    """Applications by id, and each container's application.

    Args:
        ended_apps_kept, ended_app_ttl_ms: an ended application is forgotten this long
            after it ended, and the oldest ones past this many.
    """

    def __init__(self, ended_apps_kept: int = 100, ended_app_ttl_ms: int = 3_600_000) -> None:
        self.ended_apps_kept = ended_apps_kept
        self.ended_app_ttl_ms = ended_app_ttl_ms
        self._apps: dict[str, Application] = {}
        self._container_apps: dict[str, str] = {}
        self._next_number = 1

    def next_id(self) -> str:
        """The id the next submitted application gets (taken by ``add``)."""
        return f"app-{self._next_number:04d}"

    def take_id(self, app_id: str, only: str) -> str:
        """A submitted application's id: ``app_id`` if this is the application master of
        ``only`` and it is that one, not taken yet; else a new one (``reserve_id``).

        Raises:
            InvalidArgument: an id a submit may not choose: only an application master
                takes one, its own, once.
        """
        if app_id and app_id != only:
            raise InvalidArgument(
                f"this master chooses application ids itself; submit without one (the id "
                f"{shown(app_id)} is for the application master started for it)"
                if not only else f"this application master runs {only}, not {shown(app_id)}")
        if only and (not app_id or only in self._apps):
            raise InvalidArgument(f"this application master runs {only} alone; submit other "
                                  "applications to the dispatcher (`weir master`)")
        if not only:
            return self.reserve_id()
        number = only.rsplit("-", 1)[-1]
        if number.isdecimal():  # the next ``reserve_id`` skips it
            self._next_number = max(self._next_number, int(number) + 1)
        return only

    def reserve_id(self) -> str:
        """A new application's id, taken now: a submit plans without the lock, so two
        submits planning at once get two ids (a refused one leaves a gap)."""
        app_id = self.next_id()
        self._next_number += 1
        return app_id

    def add(self, app: Application) -> None:
        """Knows ``app`` and its containers; its id is taken (a restored one's too)."""
        self._apps[app.id] = app
        for cid in app.plan.containers:
            self._container_apps[cid] = app.id
        number = app.id.rsplit("-", 1)[-1]
        if number.isdecimal():
            self._next_number = max(self._next_number, int(number) + 1)

    def add_container(self, app: Application, container_id: str) -> None:
        """A container recovery or a spare added to ``app``."""
        self._container_apps[container_id] = app.id

    def get(self, app_id: str) -> Application:
        """The application ``app_id``; ``NotFound`` names what lists them."""
        app = self._apps.get(app_id)
        if app is None:
            raise NotFound(f"unknown application {shown(app_id)}; `weir apps` lists the "
                           "applications")
        return app

    def find(self, app_id: str) -> Application | None:
        return self._apps.get(app_id)

    def is_current(self, app: Application) -> bool:
        """``app`` is still known (not forgotten, nor replaced, meanwhile)."""
        return self._apps.get(app.id) is app

    def of_container(self, container_id: str) -> Application | None:
        app_id = self._container_apps.get(container_id)
        return self._apps.get(app_id) if app_id else None

    def container(self, container_id: str) -> tuple[Application, PTContainer]:
        """The container and its application; ``NotFound`` names what lists them."""
        app = self.of_container(container_id)
        if app is None:
            raise NotFound(f"unknown container {shown(container_id)}; `weir containers` lists "
                           "the containers")
        return app, app.plan.containers[container_id]

    def all(self) -> list[Application]:
        return list(self._apps.values())

    def forget_ended(self, now_ms: int, held: Callable[[str], bool],
                     forget: Callable[[Application], None]) -> None:
        """Forgets ended applications past their time or count whose containers are gone
        and whose state folder is not ``held``; ``forget`` hears of each first."""
        ended = sorted((a for a in self._apps.values()
                        if a.terminal and not held(a.id) and not a.plan.live_containers()),
                       key=lambda a: a.finished_ms)
        surplus = len(ended) - self.ended_apps_kept
        for index, app in enumerate(ended):
            if index < surplus or now_ms - app.finished_ms >= self.ended_app_ttl_ms:
                forget(app)
                del self._apps[app.id]
                for cid in [c for c, a in self._container_apps.items() if a == app.id]:
                    del self._container_apps[cid]
                _LOGGER.info("app=%s forgotten (%s %d s ago)", app.id, app.state.value,
                             (now_ms - app.finished_ms) // 1000)
