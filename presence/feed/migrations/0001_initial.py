# The activity feed's tables. On a database where presence's old 0002_feed created them (as
# presence_group, presence_membership, presence_activity, presence_mention, before the feed was
# an app of its own), they are taken over: renamed, rows, keys, indexes and constraints kept.

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

from presence.feed.migration_operations import CreateOrTakeOver

OPERATIONS = [
    migrations.CreateModel(
        name='Group',
        fields=[
            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ('name', models.CharField(max_length=100, verbose_name='name')),
            ('slug', models.SlugField(max_length=100, unique=True, verbose_name='slug')),
            ('description', models.TextField(blank=True, default='', verbose_name='description')),
            ('created_at', models.DateTimeField(auto_now_add=True, verbose_name='created at')),
        ],
        options={
            'verbose_name': 'group',
            'verbose_name_plural': 'groups',
            'ordering': ['name', 'pk'],
        },
    ),
    migrations.CreateModel(
        name='Activity',
        fields=[
            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ('text', models.TextField(verbose_name='text')),
            ('kind', models.CharField(choices=[('post', 'post'), ('status', 'status')], default='post', max_length=16, verbose_name='kind')),
            ('created_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='created at')),
            ('author', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='presence_activities', to=settings.AUTH_USER_MODEL, verbose_name='author')),
        ],
        options={
            'verbose_name': 'activity',
            'verbose_name_plural': 'activities',
        },
    ),
    migrations.CreateModel(
        name='Membership',
        fields=[
            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ('joined_at', models.DateTimeField(auto_now_add=True, verbose_name='joined at')),
            ('group', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='memberships', to='presence_feed.group', verbose_name='group')),
            ('user', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='presence_memberships', to=settings.AUTH_USER_MODEL, verbose_name='user')),
        ],
        options={
            'verbose_name': 'membership',
            'verbose_name_plural': 'memberships',
        },
    ),
    migrations.AddField(
        model_name='group',
        name='members',
        field=models.ManyToManyField(related_name='presence_groups', through='presence_feed.Membership', to=settings.AUTH_USER_MODEL, verbose_name='members'),
    ),
    migrations.CreateModel(
        name='Mention',
        fields=[
            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ('created_at', models.DateTimeField(verbose_name='created at')),
            ('activity', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='mentions', to='presence_feed.activity', verbose_name='activity')),
            ('user', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='presence_mentions', to=settings.AUTH_USER_MODEL, verbose_name='mentioned user')),
        ],
        options={
            'verbose_name': 'mention',
            'verbose_name_plural': 'mentions',
        },
    ),
    migrations.AddIndex(
        model_name='activity',
        index=models.Index(fields=['author', '-created_at', '-id'], name='presence_activity_author'),
    ),
    migrations.AddIndex(
        model_name='activity',
        index=models.Index(fields=['-created_at', '-id'], name='presence_activity_recent'),
    ),
    migrations.AddIndex(
        model_name='membership',
        index=models.Index(fields=['user', 'group'], name='presence_membership_user'),
    ),
    migrations.AddConstraint(
        model_name='membership',
        constraint=models.UniqueConstraint(fields=('group', 'user'), name='presence_membership_unique'),
    ),
    migrations.AddIndex(
        model_name='mention',
        index=models.Index(fields=['user', '-created_at', '-activity'], name='presence_mention_user'),
    ),
    migrations.AddConstraint(
        model_name='mention',
        constraint=models.UniqueConstraint(fields=('activity', 'user'), name='presence_mention_unique'),
    ),
]


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('presence', '0002_feed'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        CreateOrTakeOver(
            OPERATIONS,
            legacy_tables={
                'group': 'presence_group',
                'membership': 'presence_membership',
                'activity': 'presence_activity',
                'mention': 'presence_mention',
            },
        ),
    ]
