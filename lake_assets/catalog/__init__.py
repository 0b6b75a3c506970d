"""Datalake catalog: file metadata documents, their validation and their index records."""
