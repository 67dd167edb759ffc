"""The lifecycle every client class shares: a :class:`ClientInstance` taken on ``start`` and given back on
``shutdown``, ``async with``, and the ``instance`` / ``client_id`` properties."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Self

from txmq.client.config import ClientConfig
from txmq.client.instance import ClientInstance, acquire_instance
from txmq.errors import MQClientError


class ClientLifecycle:
    """Base of :class:`Producer`, :class:`PushConsumer`, :class:`PullConsumer` and :class:`Admin`.

    ``start`` takes the process's shared instance for this config and ``shutdown`` gives it back; both are
    idempotent. A subclass says what joining and leaving means for it:

    * ``_attach(instance)``: register with the instance and build per-run state. If it raises, the instance is
      given back and the client stays stopped.
    * ``_on_started()``: work once the client counts as started (first heartbeat, first rebalance).
    * ``_detach(instance)``: drain and unregister; the instance is given back afterwards, even if this fails.
    """

    _what: ClassVar[str] = "client"  # how messages name the class: "producer PG is not started"

    def __init__(self, namesrv_addr: str | Sequence[str] | None, **options: Any) -> None:
        self._config = ClientConfig.build(namesrv_addr, **options) if namesrv_addr is not None else None
        self.access_key: str | None = options.get("access_key")
        self.secret_key: str | None = options.get("secret_key")
        self._lent_instance: ClientInstance | None = None  # an instance lent by its owner, never released by us
        self._instance: ClientInstance | None = None  # while started, and until shutdown's _detach returns
        self._started = False

    @property
    def config(self) -> ClientConfig:
        if self._config is None:
            raise MQClientError("no name server address given; pass namesrv_addr")
        return self._config

    @config.setter
    def config(self, config: ClientConfig) -> None:
        self._config = config

    def _name(self) -> str:
        group = getattr(self, "group", None)
        return f"{self._what} {group}" if group else self._what

    # -- the lifecycle --------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        self._check_startable()
        instance = self._lent_instance or await acquire_instance(self.config)
        try:
            self._attach(instance)
        except BaseException:
            if instance is not self._lent_instance:
                await instance.release()
            raise
        self._instance = instance
        self._started = True
        await self._on_started()

    async def shutdown(self) -> None:
        if not self._started:
            return
        self._started = False
        instance = self._instance
        assert instance is not None
        try:
            await self._detach(instance)
        finally:
            self._instance = None
            if instance is not self._lent_instance:
                await instance.release()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    @property
    def instance(self) -> ClientInstance:
        """The shared client core this client runs on; only while started."""
        if self._instance is None:
            raise MQClientError(f"{self._name()} is not started; call start() first")
        return self._instance

    @property
    def client_id(self) -> str:
        return self.instance.client_id

    # -- what subclasses fill in -------------------------------------------------------------------------------------

    def _check_startable(self) -> None:
        """Raise MQClientError when the client is not ready to start (before any instance is taken)."""

    def _attach(self, instance: ClientInstance) -> None:
        """Join ``instance``: register as a member, build per-run state."""

    async def _on_started(self) -> None:
        """First work once started."""

    async def _detach(self, instance: ClientInstance) -> None:
        """Drain and leave ``instance`` (it is released afterwards)."""
