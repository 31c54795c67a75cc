# Mention.spans: where the activity's text names the mentioned user, recorded when posted, so
# rendering links exactly the places the post resolved. A nullable column only: existing mentions
# start without one, and rendering finds them by their user's handle in the text as before.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("presence_feed", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="mention",
            name="spans",
            field=models.JSONField(
                default=None, editable=False, null=True, verbose_name="places in the text"
            ),
        ),
    ]
