"""Reusable `Annotated[..., Depends(...)]` aliases for routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.service import AttentionService
from app.settings import Settings, get_settings
from app.snapshot.served import ServedSnapshots


def get_service(request: Request) -> AttentionService:
    service: AttentionService = request.app.state.service
    return service


def get_snapshots(request: Request) -> ServedSnapshots:
    snapshots: ServedSnapshots = request.app.state.snapshots
    return snapshots


SettingsDep = Annotated[Settings, Depends(get_settings)]
ServiceDep = Annotated[AttentionService, Depends(get_service)]
SnapshotsDep = Annotated[ServedSnapshots, Depends(get_snapshots)]
