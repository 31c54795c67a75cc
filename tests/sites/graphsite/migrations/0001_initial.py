import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [migrations.swappable_dependency(settings.AUTH_USER_MODEL)]

    operations = [
        migrations.CreateModel(
            name="Follow",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("followed", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="graphsite_followers", to=settings.AUTH_USER_MODEL)),
                ("follower", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="graphsite_following", to=settings.AUTH_USER_MODEL)),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("follower", "followed"), name="graphsite_follow_once")],
            },
        ),
    ]
