"""API tokens are stored hashed (django-rest-knox): each token of rest_framework.authtoken, kept in
plain text until now, becomes a knox token with the same key, so clients keep working, and its
plain-text row is deleted. Reads the old table with SQL, whether or not its app is still installed."""

from django.db import migrations

from knox.crypto import hash_token
from knox.settings import CONSTANTS

OLD_TABLE = "authtoken_token"


def hash_existing_tokens(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if OLD_TABLE not in connection.introspection.table_names(cursor):
            return
        cursor.execute(f'SELECT "key", "user_id", "created" FROM "{OLD_TABLE}"')
        rows = cursor.fetchall()
    AuthToken = apps.get_model("knox", "AuthToken")
    for key, user_id, created in rows:
        token = AuthToken.objects.create(digest=hash_token(key), token_key=key[:CONSTANTS.TOKEN_KEY_LENGTH],
                                         user_id=user_id, expiry=None)
        AuthToken.objects.filter(pk=token.pk).update(created=created)
    with connection.cursor() as cursor:
        cursor.execute(f'DELETE FROM "{OLD_TABLE}"')


class Migration(migrations.Migration):

    dependencies = [
        ("orchestrator", "0013_user_preference"),
        ("knox", "0009_extend_authtoken_field"),
    ]

    operations = [
        migrations.RunPython(hash_existing_tokens, migrations.RunPython.noop, elidable=True),
    ]
