"""A forum's models, shaped as Spirit's (issue 38): categories, topics, private topics with
participants, comments, and users with an avatar on the user row (the card reads it without a
query per member)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models


class User(AbstractUser):
    avatar = models.FileField(upload_to="avatars/", blank=True)


class Category(models.Model):
    title = models.CharField(max_length=100)
    slug = models.SlugField(unique=True)

    def __str__(self) -> str:
        return self.title


class Topic(models.Model):
    category = models.ForeignKey(Category, on_delete=models.CASCADE, related_name="topics")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    title = models.CharField(max_length=200)
    #: a private topic (a conversation) is read by its participants only
    is_private = models.BooleanField(default=False)
    participants = models.ManyToManyField(
        settings.AUTH_USER_MODEL, related_name="private_topics", blank=True
    )

    def __str__(self) -> str:
        return self.title

    def can_be_read_by(self, user: object) -> bool:
        if not self.is_private:
            return True
        return self.participants.filter(pk=getattr(user, "pk", None)).exists()


class Comment(models.Model):
    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, related_name="comments")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    text = models.TextField()
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.text[:40]
