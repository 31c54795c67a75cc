# PrivacyException: per-person exceptions to a privacy level ("always share with" / "never
# share with"). A new table only: existing rows and every level's default are unchanged.


import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('presence', '0003_default_privacy_and_true_presence'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='PrivacyException',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('setting', models.CharField(choices=[('online_visibility', 'who sees when I am online'), ('last_seen_visibility', 'who sees my last seen'), ('activity_visibility', 'who sees my custom status and activity')], max_length=32, verbose_name='setting')),
                ('allow', models.BooleanField(default=True, help_text='Checked: always share with this viewer. Unchecked: never share.', verbose_name='always share')),
                ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='presence_privacy_exceptions', to=settings.AUTH_USER_MODEL, verbose_name='owner')),
                ('viewer', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='presence_privacy_exceptions_for', to=settings.AUTH_USER_MODEL, verbose_name='viewer')),
            ],
            options={
                'verbose_name': 'privacy exception',
                'verbose_name_plural': 'privacy exceptions',
                'indexes': [models.Index(fields=['viewer', 'owner'], name='presence_privexc_viewer')],
                'constraints': [models.UniqueConstraint(fields=('owner', 'viewer', 'setting'), name='presence_privacy_exception_unique'), models.CheckConstraint(condition=models.Q(('owner', models.F('viewer')), _negated=True), name='presence_privacy_exception_not_self')],
            },
        ),
    ]
