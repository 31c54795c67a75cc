"""A user model keyed by a UUID, as many real sites have: the settings variant
tests.settings.uuid runs a part of the real suite against it (the Makefile's `test` target)."""

from __future__ import annotations

import uuid

from django.contrib.auth.models import AbstractUser
from django.db import models


class User(AbstractUser):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
