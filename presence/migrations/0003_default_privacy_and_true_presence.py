# The privacy levels' defaults follow the site's PRESENCE["DEFAULT_PRIVACY"]: the fields name
# functions of presence.models (by reference), so no site's setting is baked in here, and changing
# the setting needs no migration. The permission presence.view_true_presence lets the moderators a
# site grants it see true presence in the admin (only there).

import presence.models
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('presence', '0002_feed'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='lastseen',
            options={'permissions': [('view_true_presence', 'Can see true presence in the admin, despite privacy')], 'verbose_name': 'last seen', 'verbose_name_plural': 'last seen'},
        ),
        migrations.AlterField(
            model_name='privacysettings',
            name='online_visibility',
            field=models.CharField(choices=[('everyone', 'Everyone'), ('contacts', 'My contacts'), ('close_friends', 'Close friends'), ('nobody', 'Nobody')], default=presence.models.default_online_visibility, max_length=16, verbose_name='who sees when I am online'),
        ),
        migrations.AlterField(
            model_name='privacysettings',
            name='last_seen_visibility',
            field=models.CharField(choices=[('everyone', 'Everyone'), ('contacts', 'My contacts'), ('close_friends', 'Close friends'), ('nobody', 'Nobody')], default=presence.models.default_last_seen_visibility, max_length=16, verbose_name='who sees my last seen'),
        ),
        migrations.AlterField(
            model_name='privacysettings',
            name='activity_visibility',
            field=models.CharField(choices=[('everyone', 'Everyone'), ('contacts', 'My contacts'), ('close_friends', 'Close friends'), ('nobody', 'Nobody')], default=presence.models.default_activity_visibility, max_length=16, verbose_name='who sees my custom status and activity'),
        ),
    ]
