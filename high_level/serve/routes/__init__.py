"""The API's routes, one ``APIRouter`` per resource, each built from the app's
:class:`high_level.serve.service.ApiService` (:func:`high_level.serve.api.create_app` includes them)."""
