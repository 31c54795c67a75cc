# LastSeen.prior_seen_at: the last seen of a UTC day before seen_at's, kept when a write of a later
# day replaces it, so the approximate last seen counts from it until midnight even once Redis has
# forgotten the user. A nullable column only: existing rows start without one (their seen_at, of
# an earlier day, is what counts until they are next written).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("presence", "0004_privacyexception"),
    ]

    operations = [
        migrations.AddField(
            model_name="lastseen",
            name="prior_seen_at",
            field=models.DateTimeField(
                blank=True, null=True, verbose_name="last seen on an earlier day"
            ),
        ),
    ]
