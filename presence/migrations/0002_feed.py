# The activity feed's tables used to be created here; the feed is now an app of its own
# (presence.feed, label presence_feed). Kept, with no operations, so that databases where it was
# applied stay consistent: presence_feed's 0001_initial takes their tables over (README
# "Activity feed", "Upgrading"); without presence.feed installed they are left untouched.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('presence', '0001_initial'),
    ]

    operations = []
